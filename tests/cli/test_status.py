"""`soulfleet status [PERSONA] [--json]`: lanes for people and for scripts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from beat.sync import RegistrySync
from tests.cli.conftest import Invoke
from tests.support.cli import (
    PASSWORD,
    commit_turn,
    dead_letter,
    lanes_for,
    settings_for,
    spend_today,
    with_budget,
)
from workers.cli.worker_health import QUEUED_TOO_LONG
from workers.fleet import Fleet
from workers.fleet.door_settings import fleet_settings_record
from workers.fleet.gate import Gate
from workers.fleet.keys import Keys
from workers.fleet.lease import Renewer
from workers.fleet.registry import PersonaRegistry
from workers.fleet.usage import UsageLedger
from workers.local.redis_server import RedisServer
from workers.persona.inbox import InboxItem
from workers.persona.messages import Usage
from workers.queues import queue_name
from workers.settings import Settings


def test_status_one_persona_json(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """--json for one persona carries the lane's state, ticks, inbox depth and last turn."""
    lanes = lanes_for(env)
    turn_id = commit_turn(lanes, "ava", "Reminder: water")
    assert invoke("post", "ava", "later", "--no-wake").exit_code == 0
    result = invoke("status", "ava", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["persona"] == "ava"
    assert payload["state"] == "idle"
    assert payload["inbox_depth"] == 1
    assert payload["pending_ticks"] == 0
    assert payload["last_turn"] == turn_id
    assert payload["last_status"] == "done"
    assert payload["attempts"] == 0


def test_status_one_persona_table(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """The table has a header and the persona's row; the last reply is shown below it."""
    commit_turn(lanes_for(env), "milo", "Found three sources")
    result = invoke("status", "milo")
    assert result.exit_code == 0, result.output
    header, row, last, models = result.stdout.splitlines()
    assert header.split()[:3] == ["PERSONA", "STATE", "TICKS"]
    assert "TOKENS TODAY" in header
    assert row.split()[:2] == ["milo", "idle"]
    assert "done" in row
    assert last == "last reply: Found three sources"
    assert models.startswith("models: conversation ")
    assert ", heartbeat " in models
    assert ", dream " in models


def test_status_names_the_models_the_fleets_workers_use_not_this_shells(
    invoke: Invoke, env: Mapping[str, str | None], redis_client: redis.Redis, key_prefix: str
) -> None:
    """beat records the fleet's SOULFLEET_MODEL, SOULFLEET_HEARTBEAT_MODEL and
    SOULFLEET_DREAM_MODEL; a shell with other values (its own SOULFLEET_MODEL) is told the
    models the fleet's turns call, not its own (the models line contradicted the last reply,
    written by the fleet's model); with no record (an older beat), the shell's own."""
    commit_turn(lanes_for(env), "milo", "Found three sources")
    fleet = Settings.from_env(
        {"SOULFLEET_MODEL": "scripted:fleet.toml", "SOULFLEET_HEARTBEAT_MODEL": "scripted:hb.toml"},
        model_reach=False,  # beat's machine has them; this one need not
    )
    shell = {**env, "SOULFLEET_MODEL": "scripted:mine.toml", "SOULFLEET_DREAM_MODEL": ""}
    before = invoke("status", "milo", environ=shell).stdout.splitlines()[-1]
    assert before == (
        "models: conversation scripted:mine.toml, heartbeat scripted:mine.toml, "
        "dream scripted:mine.toml"
    )
    redis_client.set(Keys(key_prefix).registry_settings, fleet_settings_record(fleet))
    after = invoke("status", "milo", environ=shell).stdout.splitlines()[-1]
    assert after == (
        "models: conversation scripted:fleet.toml, heartbeat scripted:hb.toml, "
        "dream scripted:fleet.toml"
    )
    payload = json.loads(invoke("status", "milo", "--json", environ=shell).stdout)
    assert payload["models"]["heartbeat"] == "scripted:hb.toml"


def test_status_says_when_every_heartbeat_is_skipped_for_its_file(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A persona with a heartbeat schedule whose HEARTBEAT.md was removed: every tick is
    skipped, and `status NAME` says so and what to do (it only said HEARTBEAT.md "changed
    after this session froze its soul"); so for one that asks for nothing; --json carries
    the reason, and the files edited since the session began. No schedule: nothing said."""
    home = fleet_root / "milo"
    (home / "persona.toml").write_text('[heartbeat]\nevery = "30m"\n')
    (home / "HEARTBEAT.md").write_text("- check the feeds\n")
    commit_turn(lanes_for(env), "milo", "Found three sources")
    assert "heartbeats:" not in invoke("status", "milo").stdout
    (home / "HEARTBEAT.md").unlink()
    out = invoke("status", "milo").stdout
    assert "heartbeats: every tick is skipped: there is no HEARTBEAT.md" in out
    assert "put it back to resume" in out
    payload = json.loads(invoke("status", "milo", "--json").stdout)
    assert payload["heartbeat_skipped"] == "no_heartbeat_file"
    assert isinstance(payload["session_edited"], list)
    (home / "HEARTBEAT.md").write_text("# Heartbeat\n<!-- nothing yet -->\n- \n")
    assert "HEARTBEAT.md asks for nothing" in invoke("status", "milo").stdout
    (home / "persona.toml").write_text("")
    assert "heartbeats:" not in invoke("status", "milo").stdout
    assert "heartbeat_skipped" not in json.loads(invoke("status", "milo", "--json").stdout)


def test_status_says_when_two_beats_serve_different_roots(
    invoke: Invoke, redis_client: redis.Redis, key_prefix: str
) -> None:
    """A beat's record that another beat serves another personas root is said on the beat's
    line, with both roots and what to do, and carried in --json."""
    assert "TWO personas roots" not in invoke("status").stdout
    record = {"root": "/srv/personas", "other": "/tmp/empty", "at": time.time() - 5}
    redis_client.set(Keys(key_prefix).registry_root_conflict, json.dumps(record))
    out = invoke("status").stdout
    assert "beats: TWO personas roots: a beat serving /srv/personas found another serving " in out
    assert "/tmp/empty" in out
    assert "give every beat the same SOULFLEET_PERSONAS" in out
    assert json.loads(invoke("status", "--json").stdout)["beat_root_conflict"] == record


def test_a_lane_retrying_a_persona_caught_mid_edit_shows_retry_and_its_own_error(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """persona.toml saved with a typo while a turn was queued: beat marks the persona invalid
    and the lane waits out its retry with PersonaEditing, counting towards a dead letter. The
    table showed `invalid` with beat's reason (only --json had the retry): it shows `retry`
    and the lane's own error, and --json's `error` is that error too."""
    (fleet_root / "ava" / "persona.toml").write_text("memroy = true\n")
    settings = settings_for(env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    RegistrySync(client=client, keys=Keys(settings.key_prefix),
                 registry=PersonaRegistry(fleet_root), settings=settings).run()  # fmt: skip
    lanes = lanes_for(env)
    editing = "PersonaEditing: PersonaConfigError: persona.toml: key 'memroy' ... in progress"
    client.hset(lanes.keys.lane("ava"), mapping={
        "state": "retry", "last_error": editing, "last_error_at": int(time.time() * 1000),
    })  # fmt: skip
    payload = json.loads(invoke("status", "ava", "--json").stdout)
    assert payload["display_state"] == "retry"
    assert payload["error"] == editing
    assert "memroy" in payload["invalid"]
    row = invoke("status", "ava").stdout.splitlines()[1]
    assert row.split()[:2] == ["ava", "retry"]
    assert "PersonaEditing" in row


def test_status_shows_a_dead_lettered_lane_and_why(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A dead-lettered lane reads state dead with its last error."""
    dead_letter(lanes_for(env), "nora", error="persona.toml exploded")
    payload = json.loads(invoke("status", "nora", "--json").stdout)
    assert payload["state"] == "dead"
    assert payload["last_error"] == "persona.toml exploded"
    table = invoke("status", "nora").stdout
    assert "persona.toml exploded" in table
    assert "dead: lane nora is dead-lettered" in table
    assert "`soulfleet revive nora`" in table


def test_a_dead_dreamer_lane_says_how_to_take_it_back(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """The revive hint names --dreamer for a dead dreamer lane, and none is given for a
    persona with no dead lane."""
    lanes = lanes_for(env)
    commit_turn(lanes, "nora-dreamer", "folded", kind="dream")
    dead_letter(lanes, "nora-dreamer", error="HTTP 400 from the provider")
    table = invoke("status", "nora").stdout
    assert "dead: lane nora-dreamer is dead-lettered" in table
    assert "`soulfleet revive nora --dreamer`" in table
    assert "dead:" not in invoke("status", "milo").stdout


def test_status_groups_dead_lanes_by_cause_with_the_revive_that_takes_them_back(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """After a fleet-wide incident (a revoked key dead-letters every lane that ran) the
    summary said only "3 dead" beside each row's error cut at 60 characters: the dead lanes
    are grouped by cause, most first, each group with the `revive --reason` that takes it
    back once fixed; a single dead lane gets no such line (its row and `status NAME` say it)."""
    lanes = lanes_for(env)
    auth = (
        "permanent failure, not retried: model call failed (ModelAuthError): openai: "
        "authentication refused (HTTP 401): invalid key"
    )
    dead_letter(lanes, "ava", error=auth)
    assert "dead: 1 lane(s)" not in invoke("status").stdout
    dead_letter(lanes, "milo", error=auth)
    dead_letter(lanes, "nora-dreamer", error="model call failed (ModelRequestError): too long")
    out = invoke("status").stdout
    lines = [line for line in out.splitlines() if line.startswith("dead: ")]
    assert len(lines) == 2, out
    assert lines[0].startswith("dead: 2 lane(s) on HTTP 401 (e.g. ava: permanent failure")
    assert "`soulfleet revive --reason 'HTTP 401'`" in lines[0]
    assert lines[1].startswith("dead: 1 lane(s) on ModelRequestError (e.g. nora-dreamer: ")
    assert "`soulfleet revive --reason ModelRequestError`" in lines[1]
    # Errors without a status or class: grouped by their own words, not by the dead letter's
    # prefix (a transient one counts its seconds per lane, so each lane was its own group).
    for lane, seconds in (("ava-dreamer", 21631), ("milo-dreamer", 21655)):
        lanes.client.hset(lanes.keys.lane(lane), mapping={"state": "dead", "last_error": (
            f"transient failures for {seconds}s (SOULFLEET_RETRY_FOR), last: persona storage "
            "unavailable: [Errno 28] No space left on device")})  # fmt: skip
    out = invoke("status").stdout
    [storage] = [line for line in out.splitlines() if "persona storage" in line]
    assert storage.startswith("dead: 2 lane(s) on persona storage unavailable: [Errno 28] (")
    assert "`soulfleet revive --reason 'persona storage unavailable: [Errno 28]'`" in storage
    revived = invoke("revive", "--reason", "HTTP 401")
    assert revived.exit_code == 0, revived.output
    assert {lanes.status(lane)["state"] for lane in ("ava", "milo")} != {"dead"}
    assert lanes.status("nora-dreamer")["state"] == "dead"


def test_status_of_a_persona_outside_its_active_hours_says_its_beats_are_skipped(
    invoke: Invoke, fleet_root: Path
) -> None:
    """Outside heartbeat.active_hours every tick is skipped: `status NAME` showed a LAST TURN
    "skipped" and no reason (it was only in beat's log). It names the window now, in --json
    too; inside the window it says nothing of it."""
    toml = fleet_root / "milo" / "persona.toml"
    base = toml.read_text(encoding="utf-8")

    def window(start: float, end: float) -> tuple[str, str]:
        opens, closes = time.gmtime(time.time() + start), time.gmtime(time.time() + end)
        first = f"{opens.tm_hour:02d}:{opens.tm_min:02d}"
        last = f"{closes.tm_hour:02d}:{closes.tm_min:02d}"
        toml.write_text(
            base + f'active_hours = {{ start = "{first}", end = "{last}" }}\n', encoding="utf-8"
        )
        return first, last

    first, last = window(2 * 3600, 3 * 3600)
    out = invoke("status", "milo").stdout
    assert f"heartbeats: outside heartbeat.active_hours now ({first}-{last} UTC)" in out
    payload = json.loads(invoke("status", "milo", "--json").stdout)
    assert payload["heartbeat_quiet"] == {"start": first, "end": last, "timezone": "UTC"}
    window(-3600, 3600)
    assert "active_hours" not in invoke("status", "milo").stdout
    assert "heartbeat_quiet" not in json.loads(invoke("status", "milo", "--json").stdout)


def test_status_all_lists_every_persona_and_fleet_counts(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """Without PERSONA: every persona under the root, lane counts, and beat liveness."""
    lanes = lanes_for(env)
    lanes.tick("milo", kind="heartbeat")
    commit_turn(lanes, "nora-dreamer", "folded", kind="dream")
    payload = json.loads(invoke("status", "--json").stdout)
    assert [entry["persona"] for entry in payload["personas"]] == ["ava", "milo", "nora"]
    assert payload["counts"] == {"queued": 1, "running": 0, "dead": 0}
    assert payload["beat"] is None
    nora = payload["personas"][2]
    assert nora["dreamer"]["lane"] == "nora-dreamer"
    table = invoke("status").stdout
    assert [line.split()[0] for line in table.splitlines()[1:4]] == ["ava", "milo", "nora"]
    assert "lanes: 1 queued, 0 running, 0 dead" in table
    assert "beat: never swept" in table
    assert "breakers: closed (no provider call counted yet;" in table


def test_a_beat_that_stopped_sweeping_is_called_out(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """beat sweeps every second: "last sweep 100s ago" alone read as fine. Past 30 s (or ten
    sweep intervals) the line says beat may have stopped and what that stops; a fresh sweep
    gets no such warning."""
    lanes = lanes_for(env)
    last = lanes.keys.last_sweep
    lanes.client.set(last, json.dumps({"at": time.time() - 100}))
    stale = [line for line in invoke("status").stdout.splitlines() if line.startswith("beat:")]
    assert len(stale) == 1
    assert "STOPPED?" in stale[0]
    assert "SOULFLEET_SWEEP_INTERVAL" in stale[0]
    lanes.client.set(last, json.dumps({"at": time.time()}))
    [fresh] = [line for line in invoke("status").stdout.splitlines() if line.startswith("beat:")]
    assert fresh.startswith("beat: last sweep ")
    assert "STOPPED?" not in fresh


def test_a_running_dream_pass_shows_how_long_it_has_run_not_when_the_last_ended(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """The DREAMER column paired the current state with the previous pass's end: a pass begun
    a moment ago read "running 32s ago". Now a running pass reads "running for Ns" (N small),
    and an idle dreamer still says when its last pass ended."""
    lanes = lanes_for(env)
    commit_turn(lanes, "nora-dreamer", "folded", kind="dream")
    idle = next(line for line in invoke("status").stdout.splitlines() if line.startswith("nora"))
    assert "idle 0s ago" in idle or "idle 1s ago" in idle, idle
    queued = lanes.tick("nora-dreamer", kind="dream")
    assert queued.turn_id is not None
    lanes.start("nora-dreamer", queued.turn_id, "test-worker")
    row = next(line for line in invoke("status").stdout.splitlines() if line.startswith("nora"))
    assert "running for 0s" in row or "running for 1s" in row, row
    assert "running 0s ago" not in row


def test_status_unknown_persona_exit_2(invoke: Invoke) -> None:
    """An unknown persona: exit 2, one line."""
    result = invoke("status", "nobody")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "unknown persona 'nobody'" in result.stderr


def test_a_dreamer_lane_named_as_a_persona_says_what_reaches_it(invoke: Invoke) -> None:
    """`status nora-dreamer` (the lane status shows in its DREAMER column) said "no directory
    'nora-dreamer'": it names the persona and the commands that reach its dreamer."""
    for command in (("status",), ("session", "show")):
        result = invoke(*command, "nora-dreamer")
        assert result.exit_code == 2
        assert "'nora-dreamer' is the dreamer lane of the persona 'nora'" in result.stderr
        assert "`soulfleet revive nora --dreamer`" in result.stderr
    assert "no directory 'ghost-dreamer'" in invoke("status", "ghost-dreamer").stderr


def test_status_of_another_root_lists_only_its_own_invalid_personas(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path, tmp_path: Path
) -> None:
    """`status --personas DIR` where the fleet's workers serve another root: DIR's personas
    are listed (with the warning), and nothing beat recorded of the fleet's own personas is
    said of DIR (its invalid ava, also when DIR is a copy holding an ava fixed there; the dead
    lane of nora, which DIR lacks, as "removed")."""
    (fleet_root / "ava" / "persona.toml").write_text("hartbeat = 1\n")
    settings = settings_for(env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    RegistrySync(client=client, keys=Keys(settings.key_prefix),
                 registry=PersonaRegistry(fleet_root), settings=settings).run()  # fmt: skip
    dead_letter(lanes_for(env), "nora", error="PersonaConfigError: persona.toml: bad")
    other = tmp_path / "other"
    (other / "alpha").mkdir(parents=True)
    (other / "alpha" / "SOUL.md").write_text("You are alpha.\n")
    (other / "ava").mkdir()  # a copy of ava, fixed there
    (other / "ava" / "persona.toml").write_text("")
    assert "invalid personas" in invoke("status").stdout  # the fleet's own root: listed
    result = invoke("status", "--personas", str(other))
    assert result.exit_code == 0, result.output
    assert "the fleet's workers serve personas from" in result.stderr
    assert "alpha" in result.stdout
    assert "invalid personas" not in result.stdout
    assert "hartbeat" not in result.stdout
    assert "removed personas" not in result.stdout
    payload = json.loads(invoke("status", "--personas", str(other), "--json").stdout)
    assert payload["invalid"] == {}
    assert payload["dead_persona_gone"] == []
    assert [entry["persona"] for entry in payload["personas"]] == ["alpha", "ava"]
    assert not any(entry.get("invalid") for entry in payload["personas"])


def test_status_missing_root_exit_2(invoke: Invoke, tmp_path: Path) -> None:
    """A personas root that does not exist is bad input, named in the error."""
    result = invoke("status", "--personas", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert "nowhere" in result.stderr


def test_status_of_the_fleets_own_root_gone_says_it_was_moved_under_the_fleet(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """The root the fleet's beat recorded is gone (moved, renamed, unmounted): status said to
    set SOULFLEET_PERSONAS or pass --personas, as to a user who typed a wrong path. It says the
    fleet's own root went away and what beat does meanwhile (exit 1, not a usage error)."""
    lanes = lanes_for(env)
    lanes.client.set(lanes.keys.registry_root, str(fleet_root.resolve()))
    fleet_root.rename(fleet_root.with_name("moved"))
    result = invoke("status")
    assert result.exit_code == 1
    assert "it is the one the fleet's workers serve" in result.stderr
    assert "beat schedules none of its personas meanwhile" in result.stderr
    assert "pass --personas" not in result.stderr


def test_status_redis_unreachable(invoke: Invoke, dead_redis_env: Mapping[str, str | None]) -> None:
    """Redis down: exit 1, the URL without its password, and a pointer to `soulfleet up`."""
    result = invoke("status", environ=dead_redis_env)
    assert result.exit_code == 1
    assert PASSWORD not in result.output
    assert ":***@127.0.0.1" in result.stderr
    assert "soulfleet up" in result.stderr


def test_status_all_shows_an_open_provider_breaker(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """An open breaker gets its own fleet-wide line (OPEN, next probe, lanes deferred, last
    error), and --json carries the same; closed breakers are summed up in one line."""
    settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
    fleet = Fleet(settings, publisher=_NoPublisher())
    fleet.breaker.record("anthropic", ok=True)
    for _ in range(settings.breaker_min_calls):
        fleet.breaker.record("openai", ok=False, error="ModelServerError: HTTP 500")
    table = invoke("status").stdout
    assert "breaker openai: OPEN since" in table
    assert "0 lane(s) deferred" in table
    assert "last error: ModelServerError: HTTP 500" in table
    assert "breakers: closed (anthropic)" in table
    payload = json.loads(invoke("status", "--json").stdout)
    assert {b["provider"]: b["open"] for b in payload["breakers"]} == {
        "anthropic": False,
        "openai": True,
    }


class _NoPublisher:
    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        raise AssertionError("nothing is published here")

    def publish_many(self, turns: object) -> None:
        raise AssertionError("nothing is published here")


def test_status_row_says_when_a_waiting_lane_runs_again(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A lane waiting out a backoff reads `retry in Ns`; its JSON has retry_at and the kind.
    The post its retry will answer is shown held (INBOX `0+1`), not as an empty inbox."""
    lanes = lanes_for(env)
    turn_id = lanes.post("ava", _item(), wake=True).turn_id
    assert turn_id is not None
    started = lanes.start("ava", turn_id, "w")
    lanes.fail(
        "ava", started.fence, error="HTTP 503", kind="transient", backoff=(60, 60), jitter=0.5
    )
    row = invoke("status", "ava").stdout.splitlines()[1]
    assert row.split()[:3] == ["ava", "retry", "in"]
    assert row.split()[5] == "0+1"  # PERSONA STATE(3 words) TICKS INBOX
    payload = json.loads(invoke("status", "ava", "--json").stdout)
    assert payload["state"] == "retry"
    assert payload["last_error_kind"] == "transient"
    assert payload["retry_at"] is not None


def _item() -> InboxItem:
    return InboxItem(text="hi", sender="external", channel="api", id="i1", at=1.0)


def test_status_lists_invalid_personas_with_their_reasons(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """Personas beat's sync refused (here a FIFO persona.toml) are listed with the reason, in
    the table, in --json and in a single persona's status; status itself never opens them."""
    home = fleet_root / "ava"
    (home / "persona.toml").unlink(missing_ok=True)
    os.mkfifo(home / "persona.toml")
    settings = settings_for(env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    RegistrySync(
        client=client,
        keys=Keys(settings.key_prefix),
        registry=PersonaRegistry(fleet_root),
        settings=settings,
    ).run()
    payload = json.loads(invoke("status", "--json").stdout)
    assert list(payload["invalid"]) == ["ava"]
    assert "FIFO" in payload["invalid"]["ava"]
    table = invoke("status").stdout
    assert "invalid personas (1, not scheduled until fixed):" in table
    assert "  ava: " in table
    assert "FIFO" in table
    one = invoke("status", "ava").stdout
    assert "INVALID (not scheduled until fixed):" in one
    assert "FIFO" in json.loads(invoke("status", "ava", "--json").stdout)["invalid"]


_OTHER_HOST_WRITER = """
import os, signal, socket, sys
socket.gethostname = lambda: "otherhost"  # the claim records this host name
import workers.persona.owners  # and another machine's kernel
workers.persona.owners.boot_id = lambda: 0x1234
from workers.persona.locks import lock_file_for, path_lock
from pathlib import Path
home = Path(sys.argv[1])
with path_lock(lock_file_for(home, home / "MEMORY.md", "shared"), mode="shared", timeout=5):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_status_names_a_shared_lock_claim_left_by_another_host(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A claim a crashed writer on ANOTHER machine left on ava's MEMORY.md (never broken
    automatically from here) is named by status: persona, file, pid and host; also when the
    operator's shell does not say SOULFLEET_LOCK_MODE=shared (the workers' setting may)."""
    (fleet_root / "ava" / "MEMORY.md").touch()
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_HOST_WRITER, str(fleet_root / "ava")], check=False
    )
    assert done.returncode == -signal.SIGKILL
    shared = {**env, "SOULFLEET_LOCK_MODE": "shared"}
    table = invoke("status", environ=shared).stdout
    assert "shared-mode lock claims (1; one whose writer died on another machine, or" in table
    assert "  ava MEMORY.md: held claim by pid " in table
    assert "on otherhost" in table
    claims = json.loads(invoke("status", "ava", "--json", environ=shared).stdout)["lock_claims"]
    assert {(c["persona"], c["file"]) for c in claims} == {("ava", "MEMORY.md")}
    assert any(c["holder"].startswith("held claim by pid") for c in claims)
    local = json.loads(invoke("status", "--json").stdout)["lock_claims"]
    assert [(c["persona"], c["file"]) for c in local] == [("ava", "MEMORY.md")]


def test_status_lists_what_blocks_a_claim_path_and_not_an_older_releases_files(
    invoke: Invoke, fleet_root: Path
) -> None:
    """Whatever sits at a claim path blocks writes, so status names it (a directory, a note's
    claim); an older release's filelock claim files (``*.shared.lock.filelock/claims/``) are
    not claims of this release and are not listed."""
    locks = fleet_root / "ava" / ".locks"
    (locks / "memory").mkdir(parents=True)
    (locks / "memory" / "ideas.md.claim").mkdir()
    old = locks / "MEMORY.md.shared.lock.filelock" / "claims"
    old.mkdir(parents=True)
    (old / "held-v1-0123456789abcdef0123456789abcdef.claim").write_text("old")
    claims = json.loads(invoke("status", "ava", "--json").stdout)["lock_claims"]
    assert [(c["file"], c["holder"]) for c in claims] == [
        ("memory/ideas.md", "unreadable claim (Is a directory)")
    ]


def test_directories_with_unusable_names_are_named_not_silently_skipped(
    invoke: Invoke, fleet_root: Path
) -> None:
    """A persona directory whose name cannot be a persona's ('my persona') is listed by
    `status` as skipped, and a command naming it says the name is the problem."""
    (fleet_root / "my persona").mkdir()
    status = invoke("status")
    assert status.exit_code == 0, status.output
    assert "directories skipped (1, not usable persona names" in status.stdout
    assert "'my persona'" in status.stdout
    posted = invoke("post", "my persona", "hi")
    assert posted.exit_code == 2
    assert "'my persona' is not a usable persona name" in posted.stderr
    assert "for example to 'my-persona'" in posted.stderr


def test_a_running_lane_says_for_how_long_and_one_persona_shows_its_whole_error(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A turn that hangs on its provider showed plain `running` for the whole model timeout:
    the table now says for how long. The table of ONE persona shows its error uncut (it was
    cut at 60 characters there too)."""
    lanes = lanes_for(env)
    turn_id = lanes.tick("ava", kind="heartbeat").turn_id
    assert turn_id is not None
    assert lanes.start("ava", turn_id, "w1").status == "started"
    table = invoke("status")
    assert table.exit_code == 0, table.output
    [row] = [line for line in table.stdout.splitlines() if line.startswith("ava ")]
    assert "running for " in row
    long_error = "ModelTimeout: " + "the provider did not answer within the timeout " * 3
    dead_letter(lanes, "milo", error=long_error)
    one = invoke("status", "milo")
    assert one.exit_code == 0, one.output
    assert " ".join(long_error.split()) in " ".join(one.stdout.split())


def test_a_turn_that_ended_short_is_explained_where_an_error_would_be(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """An incomplete turn's note (a soul over the token budget: no model call, every turn) is
    shown in the LAST ERROR column and as ``note`` in --json, while ``error`` stays null (the
    turn committed); the next turn that ends without one clears it."""
    lanes = lanes_for(env)
    note = "incomplete: the input alone (soul + session) is over the turn's token budget"
    commit_turn(lanes, "ava", "", status="incomplete", note=note)
    table = invoke("status")
    [row] = [line for line in table.stdout.splitlines() if line.startswith("ava ")]
    assert "incomplete" in row
    assert "input alone" in row
    payload = json.loads(invoke("status", "ava", "--json").stdout)
    assert payload["error"] is None
    assert payload["note"] == payload["last_note"] == note
    commit_turn(lanes, "ava", "fine again")
    payload = json.loads(invoke("status", "ava", "--json").stdout)
    assert payload["note"] is None
    assert payload["last_note"] is None


def test_a_dream_pass_that_ended_short_is_explained_in_its_personas_row(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A dreamer whose every pass ends before its model call (DREAM.md over the budget) showed
    LAST ERROR "-" on its persona's row, though a dreamer's error is shown there: its note
    is too, marked as the dreamer's, and --json has it on the dreamer."""
    lanes = lanes_for(env)
    note = "incomplete: the input alone (soul + session) is over the turn's token budget"
    commit_turn(lanes, "ava-dreamer", "", kind="dream", status="incomplete", note=note)
    [row] = [line for line in invoke("status").stdout.splitlines() if line.startswith("ava ")]
    assert "dreamer: incomplete: the input alone" in row
    payload = json.loads(invoke("status", "ava", "--json").stdout)
    assert payload["dreamer"]["note"] == note
    assert payload["note"] == f"dreamer: {note}"


def test_a_running_turn_whose_lease_is_not_renewed_is_flagged(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A worker killed mid-turn left `running for 33s` looking alive until its lease lapsed:
    once the lease has gone unrenewed for over half its TTL (a live worker renews every
    third), the row says so and when it lapses (when beat's reaper takes the lane back);
    a freshly renewed lease says nothing."""
    settings = settings_for(env)
    lanes = lanes_for(env)
    turn_id = lanes.tick("ava", kind="heartbeat").turn_id
    assert turn_id is not None
    assert lanes.start("ava", turn_id, "w1").status == "started"

    def row() -> str:
        table = invoke("status")
        assert table.exit_code == 0, table.output
        [line] = [line for line in table.stdout.splitlines() if line.startswith("ava ")]
        return line

    assert "lease not renewed" not in row()
    left_ms = int(settings.lease_ttl * 1000 * 0.2)  # 80% of the TTL without a renewal
    lanes.client.pexpire(Keys(settings.key_prefix).lease("ava"), left_ms)
    silent = round(settings.lease_ttl - left_ms / 1000)
    assert f"(lease not renewed for {silent}s, lapses in " in row()
    payload = json.loads(invoke("status", "ava", "--json").stdout)
    assert payload["lease_silent"] == silent
    assert 0 < payload["lease_left"] <= left_ms / 1000
    # The lease gone altogether (lapsed, or lost with a Redis restart): a bare "running for
    # 60s" looked alive; the row says the reaper takes it back.
    lanes.client.delete(Keys(settings.key_prefix).lease("ava"))
    assert "(lease lapsed: beat's reaper takes the lane back at its next pass)" in row()
    assert json.loads(invoke("status", "ava", "--json").stdout)["lease_silent"] == round(
        settings.lease_ttl
    )


def test_status_says_when_redis_is_full(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """Redis at its maxmemory refuses every write: `status` still answers, and says so in a
    line of its own with what to do (it said only that beat may have stopped, whose sweeps
    Redis was refusing); under the limit there is no such line."""
    with RedisServer(tmp_path / "redis") as server:
        own = {**env, "REDIS_URL": server.url}
        client = redis.Redis.from_url(server.url)
        try:
            assert "redis: FULL" not in invoke("status", environ=own).stdout
            client.config_set("maxmemory", 1)
            result = invoke("status", environ=own)
            assert result.exit_code == 0, result.output
            assert "redis: FULL" in result.stdout
            assert "CONFIG SET maxmemory" in result.stdout
            payload = json.loads(invoke("status", "--json", environ=own).stdout)
            assert payload["redis_memory"]["full"] is True
        finally:
            client.config_set("maxmemory", 0)
            client.close()


def test_status_says_when_redis_memory_nears_its_limit() -> None:
    """At 97% of maxmemory a 60 KB post was refused (OOM) while status said nothing of Redis
    (it spoke only once used >= max): from MEMORY_HIGH of it there is a line with the share
    and what to do; below it, none; at the limit, the FULL line alone."""
    from workers.cli.status import MEMORY_HIGH, _redis_lines  # noqa: PLC0415

    near = _redis_lines((970_000, 1_000_000, "noeviction"), None, 0)
    assert len(near) == 1
    assert near[0].startswith("redis: memory at 97% of its maxmemory (970,000 of 1,000,000")
    assert "CONFIG SET maxmemory" in near[0]
    assert _redis_lines((int(1_000_000 * MEMORY_HIGH) - 1, 1_000_000, "noeviction"), None, 0) == []
    assert _redis_lines((500, 0, "noeviction"), None, 0) == []  # no maxmemory: no share
    [full] = _redis_lines((1_000_000, 1_000_000, "noeviction"), None, 0)
    assert full.startswith("redis: FULL")


def test_status_answers_on_a_full_redis_with_lanes_queued_too_long(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """A full Redis stops the workers taking messages, so lanes wait queued past
    QUEUED_TOO_LONG, which makes status ping the workers: a write the full Redis refused,
    and status answered with that error alone, blind when it was needed. It shows
    everything now and says the workers were not asked (--json: unserved_queues null)."""
    with RedisServer(tmp_path / "redis") as server:
        own = {**env, "REDIS_URL": server.url}
        lanes = lanes_for(own)
        try:
            lanes.tick("milo", kind="heartbeat")
            old_ms = int((time.time() - QUEUED_TOO_LONG - 5) * 1000)
            lanes.client.hset(lanes.keys.lane("milo"), "queued_at", old_ms)
            lanes.client.config_set("maxmemory", 1)
            result = invoke("status", environ=own)
            assert result.exit_code == 0, result.output
            assert "redis: FULL" in result.stdout
            assert "milo" in result.stdout
            [line] = [x for x in result.stdout.splitlines() if x.startswith("workers:")]
            assert "not asked" in line
            assert "Redis refused the ping" in line
            payload = json.loads(invoke("status", "--json", environ=own).stdout)
            assert payload["unserved_queues"] is None
            assert payload["redis_memory"]["full"] is True
        finally:
            lanes.client.config_set("maxmemory", 0)
            lanes.client.close()


def test_a_redis_url_selecting_a_database_redis_lacks_says_so(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """REDIS_URL ending /99 on a Redis of 16 databases: exit 1, naming REDIS_URL and the
    databases it has, instead of Redis's bare "DB index is out of range"."""
    url = str(env["REDIS_URL"]).rsplit("/", 1)[0] + "/99"
    result = invoke("status", environ={**env, "REDIS_URL": url})
    assert result.exit_code == 1, result.output
    assert "Redis refused the database that REDIS_URL selects" in result.stderr
    assert "/99" in result.stderr
    assert "0-15" in result.stderr


def test_skipped_directory_line_gives_every_rule_a_name_can_break(
    invoke: Invoke, fleet_root: Path
) -> None:
    """'bob-dreamer' is made only of letters and '-': the skipped line must not tell its owner
    the allowed characters alone (which it keeps), but also the rules it breaks (it ends in
    -dreamer; at most 64 characters; no '..'), as `post` and `init` do."""
    (fleet_root / "bob-dreamer").mkdir()
    status = invoke("status")
    assert status.exit_code == 0, status.output
    line = next(x for x in status.stdout.splitlines() if x.startswith("directories skipped"))
    assert "'bob-dreamer'" in line
    assert "-dreamer" in line.replace("'bob-dreamer'", "")
    assert "64" in line


def test_lanes_waiting_in_a_queue_no_worker_consumes_are_called_out(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """With every worker gone, status showed lanes queued and nothing else. A lane queued for
    longer than QUEUED_TOO_LONG makes it ask the workers (one remote-control ping); none
    consuming that queue is said, with the queue and the count. A freshly queued lane asks
    nothing and says nothing."""
    lanes = lanes_for(env)
    lanes.tick("milo", kind="heartbeat")
    fresh = invoke("status").stdout
    assert "workers:" not in fresh
    assert json.loads(invoke("status", "--json").stdout)["unserved_queues"] == {}
    old_ms = int((time.time() - QUEUED_TOO_LONG - 5) * 1000)
    lanes.client.hset(lanes.keys.lane("milo"), "queued_at", old_ms)
    [line] = [line for line in invoke("status").stdout.splitlines() if line.startswith("workers:")]
    queue = queue_name(settings_for(env).queue_prefix, "heartbeat")
    assert f"NONE answered for {queue} (1 lane(s) queued over" in line
    assert "Workers down or dying" in line
    # and --json says it too (scripts and dashboards saw no sign of it)
    payload = json.loads(invoke("status", "--json").stdout)
    assert payload["unserved_queues"] == {"heartbeat": {"queue": queue, "lanes": 1}}


def test_a_used_up_budget_says_what_it_does_to_the_persona(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """Past [budget] daily_tokens, `status NAME` says heartbeats and dreams are skipped (or,
    with on_exceed = "stop", every turn refused) and until when, and --json says it too
    (`budget_used_up`: it was in the plain text only); under it, nothing is said."""
    with_budget(fleet_root, "milo", 100)
    spend_today(env, "milo", "c1", 40)
    assert "budget:" not in invoke("status", "milo").stdout
    spend_today(env, "milo", "c2", 90)
    out = invoke("status", "milo").stdout
    assert (
        "budget: used up today (132 of 100 tokens, on_exceed=skip_background): heartbeats "
        "and dreams are skipped, conversations still run, until " in out
    )
    used_up = json.loads(invoke("status", "milo", "--json").stdout)["budget_used_up"]
    assert {k: used_up[k] for k in ("spent", "daily_tokens", "on_exceed", "skips")} == {
        "spent": 132, "daily_tokens": 100, "on_exceed": "skip_background",
        "skips": "heartbeats_and_dreams",
    }  # fmt: skip
    assert used_up["until"].endswith("T00:00+00:00")
    toml = fleet_root / "milo" / "persona.toml"
    toml.write_text(toml.read_text("utf-8") + 'on_exceed = "stop"\n', "utf-8")
    assert "every turn is refused, posts at the door" in invoke("status", "milo").stdout
    assert json.loads(invoke("status", "milo", "--json").stdout)["budget_used_up"]["skips"] == (
        "every_turn"
    )


def test_status_says_when_redis_lost_its_data(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """Redis emptied under a running beat (here the fleet's keys deleted): the next registry
    sync rebuilds the schedule, and `status` says Redis lost its data and what was lost with
    it (it showed a clean, idle fleet); --json carries when."""
    settings = settings_for(env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = Keys(settings.key_prefix)
    sync = RegistrySync(
        client=client, keys=keys, registry=PersonaRegistry(fleet_root), settings=settings
    )
    sync.run()
    assert "lost its data" not in invoke("status").stdout
    client.delete(*client.keys(f"{settings.key_prefix}*"))
    sync.run()
    out = invoke("status").stdout
    assert "redis: lost its data " in out
    assert "inbox items, running turns and today's token counts" in out
    assert "every conversation starts over" in out
    assert "daily budgets count from 0 again" in out
    lost = json.loads(invoke("status", "--json").stdout)["redis_data_lost"]
    assert lost["personas"] == 3


def test_status_of_a_persona_names_its_model_call_in_flight(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """While milo's turn holds a turn-gate slot (its model call in flight), `status milo` says
    how long it has waited and on which worker (it said only "running"), and the fleet gauge
    soulfleet_model_call_oldest_seconds counts it; once released, neither does. A call whose
    lane's lease is no longer renewed (its worker killed) is said to be orphaned instead."""
    settings = settings_for(env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    renewer = Renewer(ttl=30)
    gate = Gate(client, Keys(settings.key_prefix), limit=5, slot_ttl=30, renewer=renewer)
    fleet = Fleet(settings, publisher=_NoPublisher())
    try:
        with gate.slot(timeout=5, lane="milo"):
            time.sleep(1.2)
            out = invoke("status", "milo").stdout
            assert "model call: lane milo has waited " in out
            assert f":{os.getpid()}; its retried tries and their waits included" in out
            assert "model.retry warnings in that worker's log" in out
            assert "model call:" not in invoke("status", "nora").stdout
            assert fleet.lane_counts()["model_call_oldest"] >= 1
            # Its worker killed: the lane runs on with no lease renewed (here: none at all),
            # and the call is said to be orphaned, not waiting.
            client.hset(Keys(settings.key_prefix).lane("milo"), "state", "running")
            out = invoke("status", "milo").stdout
            assert "has waited" not in out
            assert "but the lane's lease has not been renewed for " in out
            assert "that worker is probably gone" in out
        assert "model call:" not in invoke("status", "milo").stdout
        assert fleet.lane_counts()["model_call_oldest"] == 0
    finally:
        renewer.stop()
        fleet.client.close()


def test_budgets_are_shown_as_the_fleet_has_them_not_as_the_shell_says(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """The fleet runs with SOULFLEET_DAILY_TOKENS=100 (beat records it), this shell has none:
    `status milo` shows tokens of 100 and the used-up line (it showed no budget); a shell
    with SOULFLEET_DAILY_TOKENS=50 against a fleet without one shows none (it claimed
    heartbeats were being skipped)."""
    fleet_env = {**env, "SOULFLEET_DAILY_TOKENS": "100"}
    settings = settings_for(fleet_env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = Keys(settings.key_prefix)
    RegistrySync(
        client=client, keys=keys, registry=PersonaRegistry(fleet_root), settings=settings
    ).run()
    ledger = UsageLedger(client, keys, days=settings.usage_days)
    ledger.record(persona="milo", day=ledger.today("UTC"), model="openai:small",
                  kind="heartbeat", call_id="c1", usage=Usage(150, 1))  # fmt: skip
    shown = invoke("status", "milo").stdout
    assert "151/100" in shown
    assert "budget: used up today (151 of 100 tokens" in shown
    plain = settings_for(env)
    RegistrySync(
        client=client, keys=keys, registry=PersonaRegistry(fleet_root), settings=plain
    ).run()
    told = invoke("status", "milo", environ={**env, "SOULFLEET_DAILY_TOKENS": "50"}).stdout
    assert "budget:" not in told
    assert "151/" not in told


def test_a_persona_toml_nested_past_the_recursion_limit_is_invalid_not_a_crash(
    invoke: Invoke, fleet_root: Path
) -> None:
    """One persona's persona.toml holding an array nested 100,000 deep made `status` (and
    `soul`) fail for the whole fleet with a RecursionError traceback: it is that persona's
    invalid file, named as such, and every other persona is still shown."""
    deep = "[" * 100_000 + "]" * 100_000
    (fleet_root / "milo" / "persona.toml").write_text(f"memory_index_cap = {deep}\n")
    result = invoke("status")
    assert result.exit_code == 0, result.output
    assert "ava" in result.stdout
    soul = invoke("soul", str(fleet_root / "milo"))
    assert soul.exit_code == 2, soul.output
    assert "persona.toml: is nested too deeply to read" in soul.stderr


def test_a_retrying_lane_of_a_removed_persona_is_named(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A persona moved away mid-turn is retried for the edit grace: status counted it in
    "N retrying" and named it nowhere (the table lists the root's directories, and `status
    NAME` says it is unknown). It is named now, plain and --json."""
    lanes = lanes_for(env)
    outcome = lanes.post("milo", InboxItem(text="hi", sender="x", channel="api", id="i1", at=1.0),
                         wake=True)  # fmt: skip
    assert outcome.turn_id is not None
    started = lanes.start("milo", outcome.turn_id, "w1")
    lanes.fail("milo", started.fence, error="PersonaNotFound: gone", kind="transient",
               backoff=(30.0, 60.0), wait_at_least=30.0)  # fmt: skip
    shutil.rmtree(fleet_root / "milo")
    out = invoke("status").stdout
    assert "retrying lanes of removed personas (1, their directories are gone" in out
    assert "dead-lettered after 60s of it): milo" in out
    assert json.loads(invoke("status", "--json").stdout)["retrying_persona_gone"] == ["milo"]
