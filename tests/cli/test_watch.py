"""What `up` prints: JSON log events and beats turned into lines, and the running tally."""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from workers.cli.watch import LogTail, Reporter, follow_beats
from workers.fleet import Fleet
from workers.fleet.beats import Beat
from workers.fleet.keys import Keys
from workers.local.redis_server import RedisServer
from workers.settings import Settings


def _append(path: Path, *records: dict[str, Any] | str) -> None:
    with path.open("a", encoding="utf-8") as handle:
        for record in records:
            handle.write(record if isinstance(record, str) else json.dumps(record) + "\n")


def test_log_tail_reads_only_new_complete_json_lines(tmp_path: Path) -> None:
    """Each read returns events appended since the last; a partial line waits for its end."""
    path = tmp_path / "w.log"
    tail = LogTail(path, "worker-1")
    assert tail.read() == []
    _append(path, {"event": "a"}, "not json\n", '{"event": "b"')
    assert [e["event"] for e in tail.read()] == ["a"]
    _append(path, ', "x": 1}\n')
    events = tail.read()
    assert [(e["event"], e["x"], e["_source"]) for e in events] == [("b", 1, "worker-1")]
    assert tail.read() == []


def _reporter() -> tuple[Reporter, list[str]]:
    lines: list[str] = []
    return Reporter(lines.append), lines


def test_reporter_counts_silent_heartbeats_and_shows_only_the_first() -> None:
    """Silent heartbeats are counted and only the first gets a line; dreamer turns are no beats."""
    reporter, lines = _reporter()
    silent = {"event": "turn.end", "lane": "milo", "ticks": 1, "status": "done", "silent": True}
    reporter.events([silent, silent, {**silent, "lane": "nora-dreamer"}])
    assert reporter.tally.silent == 2
    assert reporter.tally.turns == 3
    assert [line.split()[1] for line in lines] == ["silent"]
    assert "milo: heartbeat answered HEARTBEAT_OK" in lines[0]


def test_reporter_memory_and_dream_lines() -> None:
    """A persona's memory.write is a memory line; a dreamer's memory/log.md write a dream line."""
    reporter, lines = _reporter()
    reporter.event({"event": "memory.write", "lane": "nora", "path": "MEMORY.md", "action": "add"})
    reporter.event({"event": "memory.write", "lane": "nora-dreamer", "path": "memory/log.md"})
    assert lines[0].split(maxsplit=1)[1] == "memory  nora wrote MEMORY.md (add)"
    assert lines[1].split(maxsplit=1)[1] == "dream   nora: dream pass logged to memory/log.md"
    assert (reporter.tally.memory_writes, reporter.tally.dream_passes) == (2, 1)


def test_reporter_spend_skips_are_not_errors() -> None:
    """A turn a worker ended before its model call (budget, nothing_new) is a skip line, not an
    error."""
    reporter, lines = _reporter()
    skipped = {"event": "turn.end", "lane": "ava", "status": "skipped", "reason": "budget"}
    reporter.event(skipped)
    reporter.event({**skipped, "status": "refused"})
    assert reporter.tally.errors == 0
    assert [line.split()[1] for line in lines] == ["skip", "skip"]
    assert lines[0].endswith("skip    ava: turn skipped (budget), no model call")


def test_an_input_over_the_token_budget_is_an_error_line_once_per_lane() -> None:
    """The worker's turn.input_over_budget warning repeats on every turn of a persona whose
    soul is over the budget: `up` shows it once as an error naming the setting, then counts."""
    reporter, lines = _reporter()
    over = {"event": "turn.input_over_budget", "level": "warning", "lane": "huge",
            "estimated_input_tokens": 524791, "max_tokens": 400000}  # fmt: skip
    reporter.events([over, over])
    assert len(lines) == 1
    assert "huge: turn incomplete, no model call" in lines[0]
    assert "524791 tokens, over the turn's budget of 400000" in lines[0]
    assert "SOULFLEET_TURN_MAX_TOKENS" in lines[0]
    assert reporter.tally.errors == 2


def test_reporter_beats_errors_and_status_line() -> None:
    """Beats are printed and counted; failed turns and other errors once each; status sums up."""
    reporter, lines = _reporter()
    reporter.beat(Beat(persona="ava", text="Reminder:\n water", turn_id="t", time=0.0, id="1-0"))
    reporter.event({"event": "turn.end", "lane": "ava", "status": "error", "error": "ModelError"})
    crash = {"event": "Task raised unexpected: TypeError()", "level": "error"}
    crash["_source"] = "worker-1"
    reporter.events([crash, crash])
    reporter.status({"queued": 1, "running": 1, "dead": 0}, total_lanes=5)
    tags = [line.split()[1] for line in lines]
    assert tags == ["beat", "error", "error", "status"]
    assert lines[0].endswith("beat    ava: Reminder: water")
    assert "worker-1: Task raised unexpected" in lines[2]
    assert lines[3].endswith(
        "status  lanes 3 idle, 1 queued, 1 running, 0 dead | beats 1 surfaced, 0 silent"
        " | turns 1 | memory writes 0, dream passes 0 | errors E2 x2"
    )


def test_each_distinct_error_is_printed_once_and_counted() -> None:
    """Five failed attempts of one turn error are one numbered line, and the same error on
    another lane (a provider outage failing many lanes) is that one error too: the status line
    carries the count and the lanes it hit (it numbered each lane's anew, E1..E12 for one
    outage); a different error gets its own number; a dead-letter is its own error."""
    reporter, lines = _reporter()
    failed = {
        "event": "turn.end",
        "lane": "nora",
        "status": "error",
        "error": "PersonaConfigError: x",
    }
    reporter.events([failed] * 5)
    reporter.event({**failed, "lane": "milo"})
    reporter.event({**failed, "error": "ModelUnreachable: y"})
    reporter.event(
        {"event": "turn.dead_lettered", "lane": "nora", "error": "PersonaConfigError: x"}
    )
    reporter.status({"queued": 0, "running": 0, "dead": 1, "idle": 6}, 0, personas=4, invalid=1)
    errors = [line for line in lines if line.split()[1] == "error"]
    assert [line.split()[2] for line in errors] == ["[E1]", "[E2]", "[E3]"]
    assert "nora: turn error: PersonaConfigError: x" in errors[0]
    assert "nora: turn error: ModelUnreachable: y" in errors[1]
    assert "lane nora dead-lettered" in errors[2]
    assert lines[-1].split(maxsplit=2)[2] == (
        "personas 4 (1 invalid) | lanes 6 idle, 0 queued, 0 running, 1 dead"
        " | beats 0 surfaced, 0 silent | turns 7 | memory writes 0, dream passes 0"
        " | errors E1 x6 on 2 lanes"
    )


def test_one_cause_dead_lettering_many_lanes_is_one_error() -> None:
    """A revoked key dead-letters every lane that runs: `up` printed a numbered error per lane
    (E1 ... E100 for one cause). One error now, its lanes counted on the status line; another
    cause is another error; a transient dead letter's seconds differ per lane, its cause not."""
    reporter, lines = _reporter()
    refused = "permanent failure, not retried: model call failed (ModelAuthError): HTTP 401"
    for lane in ("ava", "milo", "nora"):
        reporter.event({"event": "lane.dead_lettered", "lane": lane, "error": refused})
    reporter.event({"event": "lane.dead_lettered", "lane": "zed", "error": "HTTP 400: bad"})
    for lane, seconds in (("p1", 21631), ("p2", 21655)):
        why = f"transient failures for {seconds}s (SOULFLEET_RETRY_FOR), last: disk full"
        reporter.event({"event": "lane.dead_lettered", "lane": lane, "error": why})
    reporter.status({"queued": 0, "running": 0, "dead": 6, "idle": 0}, 0, personas=6, invalid=0)
    errors = [line for line in lines if line.split()[1] == "error"]
    assert [line.split()[2] for line in errors] == ["[E1]", "[E2]", "[E3]"], errors
    assert "lane ava dead-lettered" in errors[0]
    assert "lane zed dead-lettered" in errors[1]
    assert "lane p1 dead-lettered" in errors[2]
    assert lines[-1].endswith("errors E1 x3 on 3 lanes, E3 x2 on 2 lanes"), lines[-1]


def test_an_error_differing_only_in_a_duration_is_the_same_error() -> None:
    """A persona mid-edit fails every few seconds with "... changed 6s ago", then "8s ago":
    one error, printed once (up printed E10, E12 ... E17 for it); HTTP 500 and HTTP 503
    stay two. Celery's "Couldn't ack '<task id>'" for many tasks in one outage is one."""
    reporter, lines = _reporter()
    editing = (
        "PersonaEditing: PersonaConfigError: /srv/cara/persona.toml: is not valid TOML; "
        "the persona's files changed {}s ago, so this may be an edit in progress: the turn is "
        "retried (a persona still failing 60s after its last change is dead-lettered)"
    )  # longer than the line shows: the cut moved with the age's digits
    for age in (6, 8, 10, 10.5, 128):
        reporter.event({"event": "turn.end", "lane": "cara", "status": "error",
                        "error": editing.format(age)})  # fmt: skip
    for code in (500, 503):
        reporter.event({"event": "turn.end", "lane": "cara", "status": "error",
                        "error": f"ModelServerError: HTTP {code}"})  # fmt: skip
    for task in ("a3d0780f-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "29294245-0000-0000-0000-000000000000"):
        reporter.event({"event": f"Couldn't ack '{task}', reason: ConnectionError()",
                        "level": "error", "_source": "worker-1"})  # fmt: skip
    errors = [line for line in lines if line.split()[1] == "error"]
    assert [line.split()[2] for line in errors] == ["[E1]", "[E2]", "[E3]", "[E4]"]
    assert "cara: turn error: PersonaEditing: PersonaConfigError" in errors[0]
    assert "worker-1: Couldn't ack 'a3d0780f" in errors[3]
    assert reporter.repeated_errors() == [(1, 5, 1), (4, 2, 0)]


def test_the_status_line_counts_lanes_waiting_out_a_retry_or_a_breaker() -> None:
    """Lanes in retry or deferred by an open breaker are neither idle nor busy: the line says
    how many when there are any (it showed 5 deferred lanes as nothing at all)."""
    reporter, lines = _reporter()
    reporter.status(
        {"queued": 1, "running": 0, "dead": 0, "idle": 20, "retry": 2, "deferred": 5}, 0
    )
    assert "lanes 20 idle, 1 queued, 0 running, 0 dead, 2 retrying, 5 deferred | beats" in lines[-1]
    reporter.status({"queued": 0, "running": 0, "dead": 0, "idle": 28}, 0)
    assert "lanes 28 idle, 0 queued, 0 running, 0 dead | beats" in lines[-1]
    # Before beat's first sync (no idle count): the waiting lanes are not counted idle too.
    reporter.status({"queued": 1, "running": 0, "dead": 0, "retry": 2, "deferred": 5}, 28)
    assert "lanes 20 idle, 1 queued, 0 running, 0 dead, 2 retrying, 5 deferred" in lines[-1]


def test_log_tail_at_end_skips_what_a_previous_run_wrote(tmp_path: Path) -> None:
    """A tail made with at_end ignores existing lines and reads only later ones."""
    path = tmp_path / "w.log"
    _append(path, {"event": "old"})
    tail = LogTail.at_end(path, "worker-1")
    _append(path, {"event": "new"})
    assert [e["event"] for e in tail.read()] == ["new"]
    assert LogTail.at_end(tmp_path / "missing.log", "x").read() == []


def test_a_persona_valid_again_is_announced_with_how_to_revive() -> None:
    """beat's registry.valid_again: one `fixed` line naming the revive command."""
    reporter, lines = _reporter()
    reporter.event({"event": "registry.valid_again", "persona": "nora", "_source": "beat"})
    assert lines[0].split()[1] == "fixed"
    assert "persona nora is valid again" in lines[0]
    assert "`soulfleet revive nora`" in lines[0]


def test_another_error_line_carries_its_reason_and_hint() -> None:
    """`up` printed only the event name of other errors ("beat: beat.task_failed (see its
    log)"), so the operator had to open the log to learn why: the line now carries the
    event's ``error`` and ``hint``."""
    reporter, lines = _reporter()
    reporter.event({
        "event": "redis.evicting_policy", "level": "error", "_source": "beat",
        "error": "maxmemory-policy is allkeys-lru",
        "hint": "CONFIG SET maxmemory-policy noeviction",
    })  # fmt: skip
    [line] = lines
    assert "beat: redis.evicting_policy: maxmemory-policy is allkeys-lru; CONFIG SET" in line
    assert line.endswith("(see its log)")
    failed = {"event": "beat.task_failed", "level": "error", "_source": "beat"}
    reporter.events([{**failed, "error": "OOM"}, {**failed, "error": "OOM"}])
    reporter.event({**failed, "error": "Connection refused"})
    assert [line.split()[2] for line in lines] == ["[E1]", "[E2]", "[E3]"]
    assert "Connection refused" in lines[-1]  # its own line, not a repeat of the OOM one


class _NoPublisher:
    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        raise AssertionError("nothing is published here")

    def publish_many(self, turns: object) -> None:
        raise AssertionError("nothing is published here")


def _beat(client: redis.Redis, keys: Keys, text: str) -> None:
    client.xadd(keys.beats, {"persona": "ava", "text": text, "turn_id": text, "time": "1"})


def _next(out: queue.Queue[Beat | Exception]) -> Beat | Exception:
    return out.get(timeout=30)


@pytest.mark.integration
def test_the_beats_feed_survives_a_redis_restart_and_misses_nothing(tmp_path: Path) -> None:
    """`up`'s beats feed on a Redis that is killed and started again (its AOF kept): one error
    is reported for the outage (it ended the feed for the rest of `up`'s life), then the beat
    added before the outage's end and the one after come through, in order, none twice."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    settings = Settings.from_env({"REDIS_URL": server.url, "SOULFLEET_PERSONAS": str(tmp_path)})
    fleet = Fleet(settings, publisher=_NoPublisher())
    client = redis.Redis.from_url(server.url)
    out: queue.Queue[Beat | Exception] = queue.Queue()
    stop = threading.Event()
    follower = threading.Thread(target=follow_beats, args=(fleet, out, stop),
                                kwargs={"retry": 0.2}, daemon=True)  # fmt: skip
    try:
        _beat(client, fleet.keys, "before")  # already there: not followed
        follower.start()
        time.sleep(1.5)  # the feed is reading
        _beat(client, fleet.keys, "one")
        assert getattr(_next(out), "text", None) == "one"
        server.stop()
        assert isinstance(_next(out), Exception)
        time.sleep(1.0)
        assert out.empty(), "the same outage was reported twice"
        server = RedisServer(tmp_path / "redis", port=server.port, persistent=True).start()
        client = redis.Redis.from_url(server.url)
        _beat(client, fleet.keys, "two")
        _beat(client, fleet.keys, "three")
        got = [_next(out), _next(out)]
        assert [getattr(beat, "text", beat) for beat in got] == ["two", "three"]
    finally:
        stop.set()
        follower.join(timeout=10)
        fleet.client.close()
        server.stop()
