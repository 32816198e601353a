"""`soulfleet run PERSONA PROMPT`: one turn, in-process with --local (fleet runs: test_fleet)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis

from beat.sync import RegistrySync
from tests.cli.conftest import Invoke
from tests.support.cli import (
    PASSWORD,
    dead_letter,
    lanes_for,
    settings_for,
    soulfleet_argv,
    subprocess_env,
)
from tests.support.fleet import wait_until
from workers.fleet import Fleet
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.registry import PersonaRegistry
from workers.persona.inbox import InboxItem


def test_run_local_json_reports_text_status_usage_limit(invoke: Invoke, fleet_root: Path) -> None:
    """--local --json runs the persona in-process; a "remember:" prompt writes MEMORY.md."""
    result = invoke("run", "nora", "remember: the tea is genmaicha", "--local", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["status"] == "done"
    assert payload["limit"] is None
    assert set(payload["usage"]) >= {"input_tokens", "output_tokens"}
    assert payload["text"].startswith("Noted.")
    assert "- the tea is genmaicha" in (fleet_root / "nora" / "MEMORY.md").read_text("utf-8")


def test_run_local_recalls_what_was_written(invoke: Invoke) -> None:
    """The README's demo flow: nora writes "remember: X" down, then reads it back when asked."""
    assert (
        invoke("run", "nora", "remember: my favourite tea is genmaicha", "--local").exit_code == 0
    )
    result = invoke("run", "nora", "what do you remember?", "--local")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("My MEMORY.md as it is now:")
    assert "- my favourite tea is genmaicha" in result.stdout


def test_run_local_plain_prints_the_text(invoke: Invoke) -> None:
    """Without --json only the reply text is printed."""
    result = invoke("run", "milo", "hello", "--local")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("I am the built-in scripted model")


def test_run_local_any_directory_and_model_spec(invoke: Invoke, tmp_path: Path) -> None:
    """--local takes a directory outside the root, and --model picks the model."""
    home = tmp_path / "solo"
    home.mkdir()
    (home / "SOUL.md").write_text("You are Solo.", encoding="utf-8")
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nname = "always"\ntext = "scripted hello"\n', encoding="utf-8")
    result = invoke("run", str(home), "hi", "--local", "--model", f"scripted:{rules}", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["text"] == "scripted hello"


def test_run_local_bad_model_spec_exit_2(invoke: Invoke) -> None:
    """A model spec that names no model is bad input: exit 2, one line."""
    result = invoke("run", "ava", "hi", "--local", "--model", "nonsense:thing")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "nonsense:thing" in result.stderr


def test_a_failed_turn_with_no_text_prints_nothing_on_stdout(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A turn that ended in an error with no text printed an empty line on stdout beside the
    error on stderr (a script reading stdout got a blank answer)."""
    result = invoke(
        "run", "ava", "hi", "--local", "--model", "openai:x",
        environ={**env, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                 "SOULFLEET_MODEL_RETRIES": "0"},
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "soulfleet: turn ended error: model call failed (ModelUnreachable)" in result.stderr


def test_run_model_without_local_is_a_usage_error(invoke: Invoke) -> None:
    """--model without --local is refused: a fleet turn uses the persona's own model."""
    result = invoke("run", "ava", "hi", "--model", "scripted:builtin")
    assert result.exit_code == 2
    assert "--model only applies with --local" in result.stderr


def test_run_local_invalid_persona_toml_names_the_key(invoke: Invoke, fleet_root: Path) -> None:
    """An invalid persona.toml: exit 2, one line naming the key, no traceback."""
    (fleet_root / "ava" / "persona.toml").write_text("model = 42\n", encoding="utf-8")
    result = invoke("run", "ava", "hi", "--local")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "'model'" in result.stderr
    assert "Traceback" not in result.output


def test_run_unknown_persona_exit_2(invoke: Invoke) -> None:
    """Unknown persona, fleet or local: exit 2, one line naming it."""
    for extra in ((), ("--local",)):
        result = invoke("run", "nobody", "hi", *extra)
        assert result.exit_code == 2, extra
        assert "unknown persona 'nobody'" in result.stderr


def test_run_redis_unreachable(invoke: Invoke, dead_redis_env: Mapping[str, str | None]) -> None:
    """A fleet run with Redis down: exit 1, URL without password, `soulfleet up` suggested."""
    result = invoke("run", "ava", "hi", environ=dead_redis_env)
    assert result.exit_code == 1
    assert PASSWORD not in result.output
    assert ":***@" in result.stderr
    assert "soulfleet up" in result.stderr


def test_run_prompt_is_untrusted_unless_trusted_is_given(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """As for `post`, the prompt of a fleet `run` is stored untrusted (it renders inside the
    untrusted block); `--trusted` stores it trusted. With no worker both runs time out and
    leave their item queued."""
    assert invoke("run", "ava", "one", "--timeout", "1").exit_code != 0
    assert invoke("run", "ava", "two", "--timeout", "1", "--trusted").exit_code != 0
    lanes = lanes_for(env)
    raws = lanes.client.lrange(lanes.keys.inbox("ava"), 0, -1)
    items = [InboxItem.from_json(str(raw)) for raw in raws]
    assert [(i.text, i.trusted) for i in items] == [("one", False), ("two", True)]


def test_run_json_that_times_out_still_prints_json(invoke: Invoke) -> None:
    """With no worker, `run --json` times out with exit 1 and one JSON object on stdout saying
    so (it printed nothing there, only the error on stderr)."""
    result = invoke("run", "ava", "anyone?", "--timeout", "1", "--json")
    assert result.exit_code == 1
    outcome = json.loads(result.stdout)
    assert (outcome["persona"], outcome["status"], outcome["exit"]) == ("ava", "timeout", 1)
    assert "no answer from 'ava'" in outcome["error"]


def test_ctrl_c_while_run_waits_says_the_turn_goes_on(env: Mapping[str, str | None]) -> None:
    """Ctrl-C while `run` waits for its answer (no worker here) stops the waiting, not the
    turn: exit 1 with a line saying the message is in the inbox and where its reply will show
    (it printed only "Aborted!", and users posted again); the item stays queued. With --json,
    one JSON object says so on stdout."""
    lanes = lanes_for(env)
    for extra, text in (((), "first"), (("--json",), "second")):
        proc = subprocess.Popen(
            soulfleet_argv("run", "ava", text, "--timeout", "60", *extra),
            env=subprocess_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            inbox = lanes.keys.inbox("ava")
            wait_until(
                lambda: text in str(lanes.client.lrange(inbox, 0, -1)),  # noqa: B023 (waited here)
                timeout=30,
                what=f"run's item {text!r} in the inbox",
            )
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 1, err
        if extra:
            outcome = json.loads(out)
            assert (outcome["status"], outcome["exit"]) == ("interrupted", 1)
            assert "its turn goes on" in outcome["error"]
        else:
            assert "stopped waiting: the message is in ava's inbox" in err
            assert "soulfleet status ava" in err
        assert "Traceback" not in err
    raws = lanes.client.lrange(lanes.keys.inbox("ava"), 0, -1)
    assert [InboxItem.from_json(str(raw)).text for raw in raws] == ["first", "second"]


def _interrupted_after(post: Callable[..., Any], presses: int) -> Callable[..., Any]:
    """``Lanes.post`` that runs, then gets ``presses`` Ctrl-Cs before its answer is read."""

    def posting(self: Lanes, *args: Any, **kwargs: Any) -> Any:
        outcome = post(self, *args, **kwargs)
        for _ in range(presses):
            signal.raise_signal(signal.SIGINT)
        return outcome

    return posting


def test_ctrl_c_as_the_post_lands_says_the_message_is_kept(
    invoke: Invoke, env: Mapping[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C arriving after the post script ran but before its answer was read (the
    interrupt raised between the two) said "Aborted!" about a message that was in the inbox,
    and users posted it again: it is held until the post is known, then stops the waiting with
    the line that says the message is kept. A Ctrl-C before the post is sent still aborts and
    posts nothing."""
    lanes = lanes_for(env)
    sent = Lanes.post
    monkeypatch.setattr(Lanes, "post", _interrupted_after(sent, 1))
    result = invoke("run", "ava", "kept", "--timeout", "30")
    assert result.exit_code == 1, result.output
    assert "stopped waiting: the message is in ava's inbox" in result.stderr
    raws = lanes.client.lrange(lanes.keys.inbox("ava"), 0, -1)
    assert [InboxItem.from_json(str(raw)).text for raw in raws] == ["kept"]

    # Redis "did not answer": the user presses again
    monkeypatch.setattr(Lanes, "post", _interrupted_after(sent, 2))
    result = invoke("run", "ava", "maybe", "--timeout", "30")
    assert result.exit_code == 1, result.output
    assert "the message may or may not be in ava's inbox" in result.stderr
    assert "Aborted!" not in result.stderr
    raws = lanes.client.lrange(lanes.keys.inbox("ava"), 0, -1)
    assert [InboxItem.from_json(str(raw)).text for raw in raws] == ["kept", "maybe"]
    lanes.client.ltrim(lanes.keys.inbox("ava"), 0, 0)

    checked = Fleet.check

    def interrupted_at_the_door(self: Fleet, *args: Any, **kwargs: Any) -> Any:
        signal.raise_signal(signal.SIGINT)
        return checked(self, *args, **kwargs)

    monkeypatch.setattr(Lanes, "post", sent)
    monkeypatch.setattr(Fleet, "check", interrupted_at_the_door)
    result = invoke("run", "ava", "never sent", "--timeout", "30")
    assert result.exit_code == 1, result.output
    assert "stopped waiting" not in result.stderr
    raws = lanes.client.lrange(lanes.keys.inbox("ava"), 0, -1)
    assert [InboxItem.from_json(str(raw)).text for raw in raws] == ["kept"]


def test_an_ignored_sigint_stays_ignored_while_run_posts(
    invoke: Invoke, env: Mapping[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run` started with SIGINT ignored (a job a shell put in the background) keeps ignoring
    it while it posts: holding Ctrl-C must not make it interruptible."""
    monkeypatch.setattr(Lanes, "post", _interrupted_after(Lanes.post, 1))
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = invoke("run", "ava", "ignored", "--timeout", "1")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.exit_code == 1, result.output
    assert "no answer from 'ava' within 1s" in result.stderr
    assert "stopped waiting" not in result.stderr


def test_a_turn_stopped_by_its_token_budget_names_the_setting(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """A turn that ends at a limit says which setting it was: a bare "max_tokens" was read
    as the session's budget (session.max_tokens) or the model's output cap."""
    home = tmp_path / "ava"
    home.mkdir()
    (home / "SOUL.md").write_text("You are ava.\n")
    (home / "rules.toml").write_text(
        "[[rules]]\nwhen = { tool_results = 0 }\n"
        'calls = [{ tool = "memory", args = { action = "read" } }]\n'
        '[[rules]]\ntext = "ok"\n'
    )
    (home / "persona.toml").write_text('model = "scripted:rules.toml"\n')
    result = invoke(
        "run", "--local", str(home), "hi", environ={**env, "SOULFLEET_TURN_MAX_TOKENS": "1"}
    )
    assert result.exit_code == 1, result.output
    assert "turn ended incomplete: max_tokens (the turn's token budget, " in result.stderr
    assert "SOULFLEET_TURN_MAX_TOKENS" in result.stderr


def test_run_local_locks_memory_as_the_fleet_is_configured(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """With SOULFLEET_LOCK_MODE=shared, `run --local` takes the shared-mode claim like the
    fleet's workers (local flock would not exclude them): no local lock file is made."""
    shared = {**env, "SOULFLEET_LOCK_MODE": "shared"}
    result = invoke("run", "nora", "remember: the kettle is blue", "--local", environ=shared)
    assert result.exit_code == 0, result.output
    locks = fleet_root / "nora" / ".locks"
    assert (locks / "MEMORY.md.claim.wait").exists()
    assert not (locks / "MEMORY.md.lock").exists()
    assert "- the kettle is blue" in (fleet_root / "nora" / "MEMORY.md").read_text("utf-8")


def test_run_local_refuses_a_lock_mode_the_fleet_does_not_use(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path, tmp_path: Path
) -> None:
    """The fleet's beat records SOULFLEET_LOCK_MODE=local; `run --local` with shared locks on
    one of its personas exits 2 before any write (shared claims and local flocks do not exclude
    each other: a memory write could be lost), naming the mode to use. The fleet's own mode
    runs; so does a persona outside the fleet's root, which no worker writes."""
    settings = settings_for(env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    RegistrySync(client=client, keys=Keys(settings.key_prefix),
                 registry=PersonaRegistry(fleet_root), settings=settings).run()  # fmt: skip
    shared = {**env, "SOULFLEET_LOCK_MODE": "shared"}
    refused = invoke("run", "nora", "remember: the kettle is blue", "--local", environ=shared)
    assert refused.exit_code == 2, refused.output
    assert "writes its personas' files with local locks" in refused.stderr
    assert "Run with SOULFLEET_LOCK_MODE=local" in refused.stderr
    assert "kettle" not in (fleet_root / "nora" / "MEMORY.md").read_text("utf-8")
    assert not (fleet_root / "nora" / ".locks" / "MEMORY.md.claim.wait").exists()
    mine = invoke("run", "nora", "remember: the kettle is blue", "--local")
    assert mine.exit_code == 0, mine.output
    elsewhere = tmp_path / "elsewhere" / "nora"
    shutil.copytree(fleet_root / "nora", elsewhere)
    away = invoke("run", str(elsewhere), "remember: the pot is red", "--local", environ=shared)
    assert away.exit_code == 0, away.output


def test_run_local_keeps_the_transcripts_the_fleet_keeps(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """SOULFLEET_TRANSCRIPT_MAX_CONVERSATIONS=2 holds for `run --local` as for the workers:
    five new sessions leave two transcripts, not five."""
    kept = {**env, "SOULFLEET_TRANSCRIPT_MAX_CONVERSATIONS": "2"}
    for n in range(5):
        result = invoke("run", "milo", f"hello {n}", "--local", "--new-session", environ=kept)
        assert result.exit_code == 0, result.output
    transcripts = list((fleet_root / "milo" / "transcripts").rglob("*.jsonl"))
    assert len(transcripts) == 2, transcripts


def test_a_failure_with_json_is_also_json_on_stdout(invoke: Invoke) -> None:
    """`--json` and a failure (here an unknown persona, exit 2): stdout holds one JSON object
    with the error and the exit status (it held nothing: only stderr said why); stderr keeps
    its one line."""
    result = invoke("run", "ghost", "hi", "--json")
    assert result.exit_code == 2
    outcome = json.loads(result.stdout)
    assert outcome["exit"] == 2
    assert "unknown persona 'ghost'" in outcome["error"]
    assert result.stderr.startswith("soulfleet: error: ")
    timed_out = invoke("run", "ava", "anyone?", "--timeout", "1", "--json")
    assert len(timed_out.stdout.strip().splitlines()) == 1  # its own account only


def test_run_into_a_dead_lettered_lane_says_the_message_is_kept(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A run into a dead-lettered lane exits 1 saying the lane is dead; its message IS kept
    in the inbox (it runs after the revive), which only `post` said: a user ran it again and
    the inbox grew by one each time."""
    lanes = lanes_for(env)
    dead_letter(lanes, "ava", error="HTTP 400: bad request")
    result = invoke("run", "ava", "hello?", "--timeout", "5")
    assert result.exit_code == 1
    assert "is dead-lettered" in result.stderr
    assert "your message is kept (do not send it again): it runs after the revive" in (
        result.stderr
    )
    assert lanes.status("ava")["inbox_depth"] == 1


def test_a_run_that_timed_out_after_redis_lost_its_data_says_the_message_went_with_it(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """Redis lost its data while `run` waited (beat records when it finds its marker gone):
    the timeout says the message was probably lost and to send it again, where it pointed at a
    status that shows an idle lane and nothing else. A loss before the run began is not
    blamed."""
    lanes = lanes_for(env)
    lanes.client.set(lanes.keys.redis_data_lost, json.dumps({"at": time.time() - 3600}))
    before = invoke("run", "ava", "one", "--timeout", "1")
    assert before.exit_code == 1
    assert "Redis lost its data" not in before.stderr

    # beat's sync finds its marker gone while the run waits, and records when
    found = threading.Timer(
        1.0,
        lambda: lanes.client.set(lanes.keys.redis_data_lost, json.dumps({"at": time.time()})),
    )
    found.start()
    try:
        result = invoke("run", "ava", "two", "--timeout", "3")
    finally:
        found.join()
    assert result.exit_code == 1
    assert "no answer from 'ava' within 3s" in result.stderr
    assert "Redis lost its data" in result.stderr
    assert "send it again" in result.stderr
