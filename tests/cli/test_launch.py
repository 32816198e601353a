"""What `up` assembles: personas root, child environments and commands, persona summaries."""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
from pathlib import Path

import pytest

from workers.cli.errors import CliError
from workers.cli.launch import (
    BUILTIN_MODEL_LABEL,
    child_environ,
    child_specs,
    choose_personas,
    describe_personas,
    flower_auth,
    metrics_line,
    model_label,
)
from workers.local.demo import DEMO_PERSONAS
from workers.settings import Settings


def test_choose_personas_precedence_and_demo_copy_once(tmp_path: Path) -> None:
    """--personas beats SOULFLEET_PERSONAS beats the demo, which is copied only the first time."""
    data = tmp_path / "data" / "personas"
    mine = tmp_path / "mine"
    assert choose_personas(mine, {"SOULFLEET_PERSONAS": "/elsewhere"}, data).root == mine.resolve()
    from_env = choose_personas(None, {"SOULFLEET_PERSONAS": str(mine)}, data)
    assert (from_env.root, from_env.demo) == (mine.resolve(), False)
    assert not data.exists()
    first = choose_personas(None, {}, data)
    assert first.demo
    assert first.installed == DEMO_PERSONAS
    (data / "ava" / "SOUL.md").write_text("edited by the user", encoding="utf-8")
    (data / "milo").rename(data / "max")
    second = choose_personas(None, {}, data)
    assert second.demo
    assert second.installed == ()
    assert (data / "ava" / "SOUL.md").read_text(encoding="utf-8") == "edited by the user"
    assert sorted(p.name for p in data.iterdir()) == ["ava", "max", "nora"]


def test_relative_paths_given_to_up_are_made_absolute_for_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children run in the data folder: SOULFLEET_MCP_CONFIG=mcp.json and PYTHONPATH=tools
    (and its empty entry, the current directory) mean where `up` was started."""
    monkeypatch.chdir(tmp_path)
    given = {"SOULFLEET_MCP_CONFIG": "mcp.json", "PYTHONPATH": f"tools{os.pathsep}{os.pathsep}/abs"}
    env = child_environ(given, redis_url="redis://127.0.0.1:1/0", personas=tmp_path)
    assert env["SOULFLEET_MCP_CONFIG"] == str(tmp_path / "mcp.json")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "tools"), str(tmp_path), "/abs"]


def test_child_specs_order_stages_and_commands(tmp_path: Path) -> None:
    """beat stops first, workers next (thread pool, all queues), flower last on 127.0.0.1."""
    settings = Settings.from_env({"SOULFLEET_QUEUE_PREFIX": "qp"})
    env = child_environ({"PATH": "/bin"}, redis_url="redis://127.0.0.1:1/0", personas=tmp_path)
    specs = child_specs(settings, env, logs=tmp_path / "logs", cwd=tmp_path, workers=2,
                        flower=True, flower_port=5599)  # fmt: skip
    assert [(s.name, s.stage) for s in specs] == [
        ("beat", 0), ("worker-1", 1), ("worker-2", 1), ("flower", 2),
    ]  # fmt: skip
    worker = specs[1]
    assert worker.argv[:5] == [sys.executable, "-m", "celery", "-A", "workers"]
    assert worker.argv[worker.argv.index("-P") + 1] == "threads"
    assert worker.argv[worker.argv.index("-Q") + 1] == "qp.interactive,qp.heartbeat,qp.dream"
    assert worker.stop_signal == signal.SIGTERM  # celery's warm shutdown
    assert "--address=127.0.0.1" in specs[3].argv
    assert "--port=5599" in specs[3].argv
    assert worker.env["REDIS_URL"] == "redis://127.0.0.1:1/0"
    assert worker.env["SOULFLEET_PERSONAS"] == str(tmp_path)
    assert worker.env["SOULFLEET_LOG_FORMAT"] == "json"
    assert {s.env["SOULFLEET_METRICS_PORT"] for s in specs} == {"0"}
    assert worker.log_path == tmp_path / "logs" / "worker-1.log"


def test_metrics_ports_are_distinct_only_with_a_base(tmp_path: Path) -> None:
    """With SOULFLEET_METRICS_PORT=9100, each process serves its own port."""
    settings = Settings.from_env({"SOULFLEET_METRICS_PORT": "9100"})
    specs = child_specs(settings, {}, logs=tmp_path, cwd=tmp_path, workers=2, flower=False)
    assert {s.name: s.env["SOULFLEET_METRICS_PORT"] for s in specs} == {
        "beat": "9102", "worker-1": "9100", "worker-2": "9101",
    }  # fmt: skip


def test_metrics_line_says_when_a_port_is_taken(tmp_path: Path) -> None:
    """A metrics port another process holds is flagged in the banner (the URL would show that
    process's metrics as this child's); a free one is listed plainly."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        base = taken.getsockname()[1]
        settings = Settings.from_env({"SOULFLEET_METRICS_PORT": str(base)})
        specs = child_specs(settings, {}, logs=tmp_path, cwd=tmp_path, workers=1, flower=False)
        line = metrics_line(specs, "127.0.0.1")
    shown = {part.split(" ", 1)[0]: part for part in line.split(", ")}
    assert shown["worker-1"].startswith(f"worker-1 http://127.0.0.1:{base}/metrics (PORT IN USE")
    assert shown["beat"].startswith(f"beat http://127.0.0.1:{base + 1}/metrics")


def test_a_port_left_in_time_wait_by_a_scrape_is_not_in_use(tmp_path: Path) -> None:
    """A metrics server that closed a scrape's connection first leaves it in TIME_WAIT: the
    next `up` binds that port (as the server does, with SO_REUSEADDR), so the banner must not
    call it "PORT IN USE" (it did after every restart under Prometheus)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        base = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", base)) as scrape:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: it is the one in TIME_WAIT
            scrape.recv(1)
    settings = Settings.from_env({"SOULFLEET_METRICS_PORT": str(base)})
    specs = child_specs(settings, {}, logs=tmp_path, cwd=tmp_path, workers=1, flower=False)
    line = metrics_line(specs, "127.0.0.1")
    # Only the port in TIME_WAIT is this test's: the next ones, one per child, are whatever
    # else runs on the machine has made of them.
    [first] = [url for url in line.split(", ") if f":{base}/metrics" in url]
    assert "PORT IN USE" not in first, line


def test_model_label_says_which_model() -> None:
    """inherit -> SOULFLEET_MODEL if set, else the built-in scripted model; explicit specs win."""
    plain = Settings.from_env({})
    configured = Settings.from_env({"SOULFLEET_MODEL": "openai:gpt-4o-mini"})
    assert model_label("inherit", plain) == BUILTIN_MODEL_LABEL
    assert model_label("inherit", configured) == "openai:gpt-4o-mini (SOULFLEET_MODEL)"
    assert model_label("anthropic:claude-x", configured) == "anthropic:claude-x (persona.toml)"


def test_describe_personas_lists_models_schedules_and_lanes(tmp_path: Path) -> None:
    """One line per demo persona with its model and schedules; dreamers count as lanes."""
    root = choose_personas(None, {}, tmp_path / "personas").root
    (root / "broken").mkdir()
    (root / "broken" / "persona.toml").write_text("evrey = 1\n", encoding="utf-8")
    lines, lanes = describe_personas(root, Settings.from_env({}))
    assert [line.split()[0] for line in lines] == ["ava", "broken", "milo", "nora"]
    assert "heartbeat every 20s" in lines[0]
    assert "dream cron '0 3 * * *' UTC" in lines[0]
    assert "INVALID" in lines[1]
    assert "evrey" in lines[1]
    assert "heartbeat every 10s" in lines[2]
    assert "dream" not in lines[2]
    assert "dream every 20s" in lines[3]
    assert all(BUILTIN_MODEL_LABEL in line for line in (lines[0], lines[2], lines[3]))
    assert lanes == 2 + 1 + 1 + 2
    # A heartbeat silent outside its active hours says when it beats.
    (root / "milo" / "persona.toml").write_text(
        '[heartbeat]\nevery = "10s"\nactive_hours = { start = "08:00", end = "22:00", '
        'timezone = "Europe/Lisbon" }\n',
        encoding="utf-8",
    )
    lines, _ = describe_personas(root, Settings.from_env({}))
    assert "heartbeat every 10s from 08:00 to 22:00 Europe/Lisbon" in lines[2]


def test_flower_turns_task_events_on(tmp_path: Path) -> None:
    """Flower shows only what task events tell it: with --flower every child gets
    SOULFLEET_TASK_EVENTS=1; without it the children keep the default (events off)."""
    settings = Settings.from_env({})
    with_flower = child_specs(settings, {}, logs=tmp_path, cwd=tmp_path, workers=1, flower=True)
    assert {s.env.get("SOULFLEET_TASK_EVENTS") for s in with_flower} == {"1"}
    assert Settings.from_env(with_flower[1].env).task_events is True
    plain = child_specs(settings, {}, logs=tmp_path, cwd=tmp_path, workers=1, flower=False)
    assert {s.env.get("SOULFLEET_TASK_EVENTS") for s in plain} == {None}


def test_describe_personas_warns_of_an_empty_soul_and_a_bad_model(tmp_path: Path) -> None:
    """An empty persona directory is listed with its warning; a model spec naming no model is
    INVALID at start, as a turn would find it; a soul over the token budget and a model whose
    key this shell lacks are each named as such (one label for every warning had called them
    all an empty soul)."""
    root = tmp_path / "personas"
    (root / "blank").mkdir(parents=True)
    (root / "odd").mkdir()
    (root / "odd" / "persona.toml").write_text('model = "foo:bar"\n', encoding="utf-8")
    (root / "paid").mkdir()
    (root / "paid" / "SOUL.md").write_text("You are paid.\n")
    (root / "paid" / "persona.toml").write_text('model = "anthropic:claude-x"\n')
    (root / "wordy").mkdir()
    (root / "wordy" / "SOUL.md").write_text("word " * 4000)
    settings = Settings.from_env({"SOULFLEET_TURN_MAX_TOKENS": "1000"})
    lines = dict(line.split(maxsplit=1) for line in describe_personas(root, settings)[0])
    assert "WARNING: persona blank has none of the bootstrap files" in lines["blank"]
    assert "INVALID" in lines["odd"]
    assert "ANTHROPIC_API_KEY, which is not set here" in lines["paid"]
    assert "empty soul" not in lines["paid"]
    assert "over the turn budget (SOULFLEET_TURN_MAX_TOKENS=1000)" in lines["wordy"]
    assert "foo:bar" in lines["odd"]


def test_flower_gets_basic_auth_generated_once_and_never_printed(tmp_path: Path) -> None:
    """`up --flower` without FLOWER_BASIC_AUTH: a password is generated into a 0600 file and
    reused; the note names the file, never the password; Flower's child env carries the auth;
    FLOWER_BASIC_AUTH, when set, wins."""
    secret = tmp_path / "flower-auth"
    auth, note = flower_auth({}, secret)
    user, password = auth.split(":", 1)
    assert user == "soulfleet"
    assert len(password) >= 20
    assert password not in note
    assert str(secret) in note
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert flower_auth({}, secret) == (auth, note)
    assert flower_auth({"FLOWER_BASIC_AUTH": "me:pw"}, secret)[0] == "me:pw"
    specs = child_specs(Settings(), {}, logs=tmp_path, cwd=tmp_path, workers=1, flower=True,
                        flower_auth=auth)  # fmt: skip
    flower = next(spec for spec in specs if spec.name == "flower")
    assert flower.env["FLOWER_BASIC_AUTH"] == auth
    assert all("FLOWER_BASIC_AUTH" not in spec.env for spec in specs if spec.name != "flower")


@pytest.mark.parametrize("content", ["", "soulfleet:reused-password-123\n"])
def test_the_flower_password_file_is_owner_only_whatever_was_there(
    tmp_path: Path, content: str
) -> None:
    """A flower-auth file already there with a wider mode (an empty one a person made, a copy
    of a data folder): the password `up` writes or reuses is then in a file every local user
    can read. It is made 0600 before the password is used."""
    secret = tmp_path / "flower-auth"
    secret.write_text(content)
    secret.chmod(0o644)
    auth, _ = flower_auth({}, secret)
    assert ":" in auth
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_a_flower_password_file_that_is_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    """A symlink planted at flower-auth's name: the password is never written through it nor
    its target's mode changed (chmod followed links), and `up` says what to do instead of a
    traceback."""
    target = tmp_path / "elsewhere"
    target.write_text("keep me\n")
    target.chmod(0o644)
    secret = tmp_path / "flower-auth"
    secret.symlink_to(target)
    with pytest.raises(CliError, match="not a symlink"):
        flower_auth({}, secret)
    assert target.read_text() == "keep me\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_describe_personas_does_not_call_a_slow_tool_import_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` listed a persona whose Python tool was still importing at its limit as INVALID,
    though beat does not call it invalid and its turns retry it (ToolSetupSlow is transient):
    it says the tools are still setting up and that its turns are retried."""
    from workers.persona import python_tools  # noqa: PLC0415

    monkeypatch.setattr(python_tools, "SETUP_TIMEOUT", 0.3)
    module = f"slow_at_up_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text("import threading\nthreading.Event().wait(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    root = choose_personas(None, {}, tmp_path / "personas").root
    with (root / "ava" / "persona.toml").open("a") as toml:
        toml.write(f'\n[[tools.python]]\nref = "{module}:tool"\n')
    lines, _ = describe_personas(root, Settings.from_env({}))
    name, rest = lines[0].split(None, 1)
    assert name == "ava"
    assert rest.startswith("tools still setting up:")
    assert "INVALID" not in lines[0]
    assert "its turns are retried until that finishes" in lines[0]
