"""`soulfleet session show|reset` against the suite's real Redis and the demo personas, and
`soulfleet run --local [--new-session]` continuing a session in the persona's directory."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tests.cli.conftest import Invoke
from tests.support.rig import turn_engine
from workers.persona.session import COMPACTION_FAILED, SessionState
from workers.persona.session_files import current_session


def test_show_without_a_session(invoke: Invoke) -> None:
    """A persona that never ran: `show --json` reports no session, plainly."""
    result = invoke("session", "show", "nora", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["id"] is None
    assert (report["turns"], report["messages"], report["compactions"]) == (0, 0, 0)
    plain = invoke("session", "show", "nora")
    assert "no session yet" in plain.stdout


def test_reset_bumps_the_epoch_and_show_says_so(invoke: Invoke) -> None:
    """`session reset` ends the session (exit 0, one line); `show` reports the new epoch."""
    result = invoke("session", "reset", "nora")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "reset nora: its next turn starts a new session"
    report = json.loads(invoke("session", "show", "nora", "--json").stdout)
    assert report["epoch"] == 1
    again = invoke("session", "reset", "nora", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {"persona": "nora", "reset": True, "epoch": 2}


def test_unknown_persona_is_bad_input(invoke: Invoke) -> None:
    """An unknown persona: exit 2 with one line, as for every command."""
    result = invoke("session", "show", "nobody")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1


def test_local_runs_continue_a_session_until_new_session(invoke: Invoke, fleet_root: Path) -> None:
    """`run --local` continues the persona's session in its directory; --new-session starts
    another one."""
    home = fleet_root / "milo"
    for text in ("hello", "hello again"):
        assert invoke("run", "milo", text, "--local").exit_code == 0
    first = current_session(home, "milo")
    assert first is not None
    assert first.turns == 2
    assert invoke("run", "milo", "fresh", "--local", "--new-session").exit_code == 0
    second = current_session(home, "milo")
    assert second is not None
    assert second.id != first.id
    assert second.turns == 1


def test_show_and_status_say_which_edited_files_the_session_goes_on_without(
    invoke: Invoke, fleet_root: Path, redis_url: str, key_prefix: str
) -> None:
    """A fleet session froze milo's soul; HEARTBEAT.md edited since is named by `session show`
    (text and JSON) and `status milo`, with the reset that applies it; after the reset (the
    session is over) neither names it."""
    with turn_engine(redis_url, key_prefix, fleet_root, {}, gate_limit=1) as engine:
        fleet, executor, published = engine
        fleet.post("milo", "hello", wake=True)
        lane, turn_id, _ = published.sent.pop()
        assert executor.execute(lane, turn_id).outcome == "done"
    assert json.loads(invoke("session", "show", "milo", "--json").stdout)["edited"] == []
    heartbeat = fleet_root / "milo" / "HEARTBEAT.md"
    heartbeat.write_text(heartbeat.read_text() + "\n- due: call mum\n")
    report = json.loads(invoke("session", "show", "milo", "--json").stdout)
    assert report["edited"] == ["HEARTBEAT.md"]
    shown = invoke("session", "show", "milo").stdout
    assert "HEARTBEAT.md changed after this session froze its soul" in shown
    assert "it goes on with it as it was until it ends" in shown  # one file: "it", not "them"
    assert "`soulfleet session reset milo` makes the next turn read it" in shown
    status = invoke("status", "milo")
    assert status.exit_code == 0, status.output
    assert "session: HEARTBEAT.md changed after this session froze its soul" in status.stdout
    manifest = fleet_root / "milo" / "persona.toml"
    good = manifest.read_text()
    manifest.write_text("[heartbeat\n")  # status is what people run on a broken persona
    broken = invoke("status", "milo")
    assert broken.exit_code == 0, broken.output
    assert broken.stdout.splitlines()[1].startswith("milo")
    manifest.write_text(good)
    assert invoke("session", "reset", "milo").exit_code == 0
    assert json.loads(invoke("session", "show", "milo", "--json").stdout)["edited"] == []
    assert "froze its soul" not in invoke("status", "milo").stdout


def test_show_says_when_the_last_compaction_failed(
    invoke: Invoke, fleet_root: Path, redis_url: str, key_prefix: str
) -> None:
    """A session whose last summary call failed (kept in its state until one succeeds) is
    shown so: when, why, and that its history grows past the budget meanwhile; `--json`
    carries it as ``compaction_failed``."""
    with turn_engine(redis_url, key_prefix, fleet_root, {}, gate_limit=1) as engine:
        fleet, executor, published = engine
        fleet.post("milo", "hello", wake=True)
        lane, turn_id, _ = published.sent.pop()
        assert executor.execute(lane, turn_id).outcome == "done"
        name = fleet.lanes.session_pointer("milo").state
    assert name is not None
    assert json.loads(invoke("session", "show", "milo", "--json").stdout)[
        "compaction_failed"] is None  # fmt: skip
    assert "compaction:" not in invoke("session", "show", "milo").stdout
    path = fleet_root / "milo" / "sessions" / "milo" / name
    state = SessionState.from_json(path.read_bytes())
    failed = {"at": 1_700_000_000.0, "error": "ModelServerError: HTTP 503"}
    path.write_bytes(replace(state, extra={COMPACTION_FAILED: failed}).to_json())
    assert json.loads(invoke("session", "show", "milo", "--json").stdout)[
        "compaction_failed"] == failed  # fmt: skip
    shown = invoke("session", "show", "milo").stdout
    assert (
        "compaction:    FAILING since 2023-11-14 22:13:20 UTC: ModelServerError: HTTP 503" in shown
    )
    assert "the session grows past session.max_tokens" in shown
