"""beat/sync.py: the personas root becomes schedule entries; cheap, idempotent, fault-isolated."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path

import redis
from prometheus_client import REGISTRY

from beat.entries import LOSS_KEPT, SETTINGS_RECORD_TTL
from beat.schedule import ScheduleSpec, to_ms
from beat.sync import RECONCILE_EVERY, RegistrySync, SyncReport
from tests.beat.conftest import Events
from tests.support.beat import write_persona
from workers.fleet import Fleet
from workers.fleet.registry import PersonaRegistry
from workers.persona.clock import VirtualClock
from workers.persona.manifest import PersonaConfig, load_manifest
from workers.persona.mcp_servers import parse_mcp_servers
from workers.settings import Settings

EVERY_1M = '[heartbeat]\nevery = "1m"\n'
EVERY_2M = '[heartbeat]\nevery = "2m"\n'
WITH_DREAM = (
    '[heartbeat]\nevery = "30m"\n'
    '[dream]\ncron = "0 3 * * *"\ntimezone = "Europe/Berlin"\nwindow = "1h"\n'
)


class CountingLoader:
    """load_manifest, counting which personas it was asked to parse."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, home: Path) -> PersonaConfig:
        self.calls.append(home.name)
        return load_manifest(home)


def make_sync(fleet: Fleet, loader: CountingLoader | None = None) -> RegistrySync:
    return RegistrySync(
        client=fleet.client,
        keys=fleet.keys,
        registry=fleet.registry,
        settings=fleet.settings,
        clock=fleet.clock,
        loader=loader or CountingLoader(),
    )


def checking_sync(fleet: Fleet, settings: Settings | None = None) -> RegistrySync:
    """A sync with its own loader, as beat runs it: it checks each persona's model spec and
    tools, which make_sync's counting loader skips."""
    return RegistrySync(
        client=fleet.client,
        keys=fleet.keys,
        registry=fleet.registry,
        settings=settings or fleet.settings,
        clock=fleet.clock,
    )


def rewrite(path: Path, text: str) -> None:
    """Rewrite a file and move its mtime on, as an edit seconds later would."""
    before = path.stat().st_mtime_ns
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def schedule(client: redis.Redis, fleet: Fleet) -> dict[str, float]:
    pairs: list[tuple[str, float]] = client.zrange(fleet.keys.schedule, 0, -1, withscores=True)  # type: ignore[assignment]
    return dict(pairs)


def registry_record(client: redis.Redis, fleet: Fleet, name: str) -> dict[str, str]:
    raw = client.hget(fleet.keys.registry, name)
    assert isinstance(raw, str)
    record: dict[str, str] = json.loads(raw)
    return record


def invalid_gauge() -> float | None:
    return REGISTRY.get_sample_value("soulfleet_registry_invalid_personas")


def test_sync_adds_heartbeat_and_dream_entries(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """A persona with [heartbeat] and [dream] gets "<name>|heartbeat" and "<name>-dreamer|dream"."""
    write_persona(persona_root, "ava", WITH_DREAM)
    write_persona(persona_root, "bob", None)  # no persona.toml: no schedules, still registered
    report = make_sync(fleet).run()
    assert report.added == 2
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat", "ava-dreamer|dream"}
    spec = ScheduleSpec.from_json(str(redis_client.hget(fleet.keys.schedule_spec, "ava|heartbeat")))
    assert (spec.every, spec.kind, spec.home) == (1800.0, "heartbeat", str(persona_root / "ava"))
    dream = ScheduleSpec.from_json(
        str(redis_client.hget(fleet.keys.schedule_spec, "ava-dreamer|dream"))
    )
    assert (dream.cron, dream.timezone, dream.window) == ("0 3 * * *", "Europe/Berlin", 3600.0)
    assert registry_record(redis_client, fleet, "ava")["error"] == ""
    assert registry_record(redis_client, fleet, "bob")["path"] == str(persona_root / "bob")
    assert redis_client.get(fleet.keys.registry_lanes) == "3"  # ava, ava-dreamer, bob


def test_the_fleets_door_settings_are_recorded_for_a_day_after_each_sync(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """Each sync records the budget and inbox limits beat reads (what a `soulfleet` shell then
    keeps to), kept a day: a fleet whose beat is gone stops speaking for the shells."""
    write_persona(persona_root, "ava", None)
    make_sync(fleet).run()
    record = json.loads(str(redis_client.get(fleet.keys.registry_settings)))
    assert record["inbox_max"] == fleet.settings.inbox_max
    assert record["item_max_bytes"] == fleet.settings.item_max_bytes
    assert 0 < redis_client.ttl(fleet.keys.registry_settings) <= SETTINGS_RECORD_TTL


def test_a_new_entry_gets_its_phase_offset_first_due(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, clock: VirtualClock
) -> None:
    """A new entry's first due time is its phase slot, inside the first interval from now."""
    write_persona(persona_root, "ava", EVERY_1M)
    make_sync(fleet).run()
    due_ms = schedule(redis_client, fleet)["ava|heartbeat"]
    spec = ScheduleSpec.from_json(str(redis_client.hget(fleet.keys.schedule_spec, "ava|heartbeat")))
    assert clock.time() * 1000 < due_ms <= (clock.time() + 60 * (1 + spec.jitter)) * 1000
    assert due_ms == to_ms(spec.next_due(clock.time()))


def test_a_sync_records_the_root_it_served_for_the_cli(fleet: Fleet, persona_root: Path) -> None:
    """Before any beat synced, the fleet knows no served root; after, it is the real path of
    the root beat scanned (what `up` and `post --personas` compare their own root with)."""
    assert fleet.served_root() is None
    write_persona(persona_root, "ava", None)
    make_sync(fleet).run()
    assert fleet.served_root() == persona_root.resolve()


def test_sync_adds_a_persona_created_later(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """A directory that appears between syncs is scheduled by the next sync, no restart."""
    sync = make_sync(fleet)
    write_persona(persona_root, "ava", EVERY_1M)
    sync.run()
    write_persona(persona_root, "bob", EVERY_1M)
    report = sync.run()
    assert report.added == 1
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat", "bob|heartbeat"}


def test_sync_picks_up_a_changed_interval_and_rescores_from_now(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, clock: VirtualClock
) -> None:
    """Editing every = "1m" to "2m" updates the spec and re-scores the entry from now."""
    home = write_persona(persona_root, "ava", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    clock.advance(600)
    rewrite(home / "persona.toml", EVERY_2M)
    report = sync.run()
    assert report.updated == 1
    spec = ScheduleSpec.from_json(str(redis_client.hget(fleet.keys.schedule_spec, "ava|heartbeat")))
    assert spec.every == 120.0
    due_ms = schedule(redis_client, fleet)["ava|heartbeat"]
    assert clock.time() * 1000 < due_ms <= (clock.time() + 120 * 1.1) * 1000


def test_sync_removes_a_deleted_persona(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """Deleting a persona directory removes its entries, specs and registry record."""
    write_persona(persona_root, "ava", WITH_DREAM)
    write_persona(persona_root, "bob", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    shutil.rmtree(persona_root / "ava")
    report = sync.run()
    assert report.removed == 2
    assert set(schedule(redis_client, fleet)) == {"bob|heartbeat"}
    assert redis_client.hkeys(fleet.keys.schedule_spec) == ["bob|heartbeat"]
    assert redis_client.hget(fleet.keys.registry, "ava") is None


def test_removing_the_dream_section_removes_only_the_dream_entry(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """A schedule dropped from persona.toml disappears; the other one stays."""
    home = write_persona(persona_root, "ava", WITH_DREAM)
    sync = make_sync(fleet)
    sync.run()
    rewrite(home / "persona.toml", EVERY_1M)
    report = sync.run()
    assert (report.removed, report.updated) == (1, 1)
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat"}


def test_unchanged_files_are_not_reparsed(fleet: Fleet, persona_root: Path) -> None:
    """A second sync parses nothing; touching HEARTBEAT.md re-parses nothing; editing one
    persona.toml re-parses exactly that persona."""
    for name in ("ava", "bob", "cyd"):
        write_persona(persona_root, name, EVERY_1M)
    loader = CountingLoader()
    sync = make_sync(fleet, loader)
    sync.run()
    assert sorted(loader.calls) == ["ava", "bob", "cyd"]
    assert sync.run().parsed == 0
    rewrite(persona_root / "bob" / "HEARTBEAT.md", "Something new.\n")
    assert sync.run().parsed == 0
    rewrite(persona_root / "cyd" / "persona.toml", EVERY_2M)
    assert sync.run().parsed == 1
    assert sorted(loader.calls) == ["ava", "bob", "cyd", "cyd"]


def test_an_unchanged_spec_keeps_its_score(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, clock: VirtualClock
) -> None:
    """Later syncs (and a second beat's sync) leave an unchanged entry's due time alone."""
    write_persona(persona_root, "ava", EVERY_1M)
    make_sync(fleet).run()
    before = schedule(redis_client, fleet)
    clock.advance(45)
    other_beat = make_sync(fleet)  # a fresh process: full reconcile, but nothing differs
    report = other_beat.run()
    assert (report.added, report.updated, report.removed) == (0, 0, 0)
    assert schedule(redis_client, fleet) == before


def test_a_bad_persona_toml_is_reported_and_the_others_keep_their_schedules(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """An invalid persona.toml is logged, recorded and counted; other personas are untouched."""
    write_persona(persona_root, "ava", EVERY_1M)
    write_persona(persona_root, "bob", '[heartbeat]\nevrey = "1m"\n')
    report = make_sync(fleet).run()
    assert report.invalid == 1
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat"}
    [logged] = events.named("registry.invalid")
    assert logged["persona"] == "bob"
    assert logged["key"] == "heartbeat.evrey"
    assert "is not a known key" in logged["error"]
    assert logged["log_level"] == "warning"
    record = registry_record(redis_client, fleet, "bob")
    assert "heartbeat.evrey" in record["error"]
    assert invalid_gauge() == 1.0


def test_a_persona_that_turns_invalid_is_paused_until_fixed(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """Its entries are removed while the file is broken, and come back on the same grid slot."""
    home = write_persona(persona_root, "ava", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    before = schedule(redis_client, fleet)["ava|heartbeat"]
    rewrite(home / "persona.toml", '[heartbeat]\nevery = "soon"\n')
    sync.run()
    assert schedule(redis_client, fleet) == {}
    assert "heartbeat.every" in registry_record(redis_client, fleet, "ava")["error"]
    sync.run()  # still broken: reported once, not on every sync
    assert len(events.named("registry.invalid")) == 1
    rewrite(home / "persona.toml", EVERY_1M)
    sync.run()
    assert schedule(redis_client, fleet) == {"ava|heartbeat": before}
    assert registry_record(redis_client, fleet, "ava")["error"] == ""
    assert invalid_gauge() == 0.0


def test_a_cron_that_can_never_fire_makes_the_persona_invalid(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """Cron semantics are checked at sync: Feb 30 is reported under key dream.cron."""
    write_persona(persona_root, "ava", '[dream]\ncron = "0 0 30 2 *"\n')
    make_sync(fleet).run()
    [logged] = events.named("registry.invalid")
    assert logged["key"] == "dream.cron"
    assert "never fire" in logged["error"]
    assert schedule(redis_client, fleet) == {}


def test_directories_with_unusable_names_are_reported_and_skipped(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """A directory named like a dreamer lane or with spaces is reported once; dot-dirs silently."""
    write_persona(persona_root, "ava-dreamer", EVERY_1M)
    write_persona(persona_root, "has space", EVERY_1M)
    write_persona(persona_root, ".git", EVERY_1M)
    sync = make_sync(fleet)
    report = sync.run()
    sync.run()
    assert sorted(report.invalid_names) == ["ava-dreamer", "has space"]
    assert sorted(e["persona"] for e in events.named("registry.invalid_name")) == [
        "ava-dreamer",
        "has space",
    ]
    assert schedule(redis_client, fleet) == {}


def test_first_sync_removes_entries_of_personas_deleted_while_no_beat_ran(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """A new beat process reconciles fully: orphaned entries and records are removed."""
    write_persona(persona_root, "ava", WITH_DREAM)
    write_persona(persona_root, "bob", EVERY_1M)
    make_sync(fleet).run()
    shutil.rmtree(persona_root / "ava")
    report = make_sync(fleet).run()  # the restarted beat never saw ava
    assert report.removed == 2
    assert set(schedule(redis_client, fleet)) == {"bob|heartbeat"}
    assert redis_client.hkeys(fleet.keys.registry) == ["bob"]


def test_sync_restores_entries_lost_from_redis(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """If the schedule key is lost (a hand edit), the next sync notices and rewrites it, at
    warning level; that is not a loss of Redis's data (the marker is there)."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    before = schedule(redis_client, fleet)
    assert events.named("schedule.drifted") == []
    redis_client.delete(fleet.keys.schedule)
    report = sync.run()
    assert (report.added, report.updated) == (0, 1)
    assert schedule(redis_client, fleet) == before
    [drifted] = events.named("schedule.drifted")
    assert drifted["log_level"] == "warning"
    assert events.named("redis.data_lost") == []


def test_records_another_beat_left_are_written_back_a_slice_per_sync(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """Another beat (started without the fleet's MCP config, say) recorded valid personas with
    no schedule entries as invalid, then stopped: the entry count did not move, so this beat,
    whose files did not change, never wrote the records back, and status called the personas
    invalid until someone touched their files. Each sync now compares a slice of the records
    with its own (all of them within RECONCILE_EVERY seconds of syncs: here 30 syncs, one
    persona each) and writes back only those that differ."""
    names = ["quiet1", "quiet2", "quiet3"]
    for name in names:
        write_persona(persona_root, name, "")  # answers posts only: no schedule entry
    sync = make_sync(fleet)
    sync.run()
    good = {name: registry_record(redis_client, fleet, name) for name in names}
    assert fleet.settings.sync_interval * 30 == RECONCILE_EVERY
    for name in names:
        bad = {**good[name], "error": "key 'tools.mcp[0].use' names no server (another beat)"}
        redis_client.hset(fleet.keys.registry, name, json.dumps(bad))
    sync.run()
    fixed = [name for name in names if registry_record(redis_client, fleet, name) == good[name]]
    assert len(fixed) == 1  # one slice: not the whole registry at once
    sync.run()
    sync.run()
    assert {name: registry_record(redis_client, fleet, name) for name in names} == good


def test_every_record_is_compared_within_a_pass_whatever_the_slices_and_wraps(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """101 personas in 30 syncs' pass: slices of 4, 26 syncs a pass, the last slice short.
    Every record another beat changed is back within one pass of syncs, and again in the next
    (a cursor that moved a whole slice past the end skipped the first names of the next
    pass, and more of them at every pass)."""
    names = [f"p{n:03d}" for n in range(101)]
    for name in names:
        write_persona(persona_root, name, "")
    sync = make_sync(fleet)
    sync.run()
    good = {name: registry_record(redis_client, fleet, name) for name in names}
    for _ in range(2):
        for name in names:
            bad = {**good[name], "error": "another beat's view"}
            redis_client.hset(fleet.keys.registry, name, json.dumps(bad))
        for _ in range(26):
            sync.run()
        assert {name: registry_record(redis_client, fleet, name) for name in names} == good


def test_specs_another_beat_wrote_with_other_settings_are_written_back(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """Another beat with another SOULFLEET_HEARTBEAT_JITTER (a rolling change) wrote its specs
    for a persona whose files and record did not change: this beat's slices write its own
    specs back (the record check alone left the fleet on the other beat's settings)."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    mine = redis_client.hgetall(fleet.keys.schedule_spec)
    other = RegistrySync(
        client=fleet.client,
        keys=fleet.keys,
        registry=fleet.registry,
        settings=dataclasses.replace(fleet.settings, heartbeat_jitter=0.5),
        clock=fleet.clock,
        loader=CountingLoader(),
    )
    other.run()
    assert redis_client.hgetall(fleet.keys.schedule_spec) != mine
    for _ in range(30):
        sync.run()
    assert redis_client.hgetall(fleet.keys.schedule_spec) == mine


def test_a_personas_root_gone_under_a_running_beat_is_an_error_up_shows(
    fleet: Fleet, persona_root: Path, events: Events
) -> None:
    """The root moved away while beat runs: its sync schedules nothing until it is back. That
    was a warning, which `up` (it shows errors) never showed: `up` printed "personas 0" with
    no word why. An error now, saying what happened and what to do."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync = make_sync(fleet)
    assert sync.run().personas == 1
    persona_root.rename(persona_root.with_name("moved"))
    assert sync.run().personas == 0
    [missing] = events.named("registry.root_missing")
    assert missing["log_level"] == "error"
    assert "moved, renamed or unmounted" in missing["error"]


def test_a_persona_added_or_removed_is_no_drift_and_no_loss(
    fleet: Fleet, persona_root: Path, events: Events
) -> None:
    """Adding and removing personas under a running beat changes the schedule it expects: no
    `schedule.drifted` (each change rewrote the whole schedule and warned), no data loss."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    write_persona(persona_root, "bob", WITH_DREAM)
    assert sync.run().added == 2
    shutil.rmtree(persona_root / "ava")
    assert sync.run().removed == 1
    assert events.named("schedule.drifted") == []
    assert events.named("redis.data_lost") == []


def test_a_redis_that_lost_its_data_under_a_running_beat_is_reported(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """Every key of the fleet gone (a restart without AOF, FLUSHALL) while beat runs: its next
    sync finds its marker gone, logs redis.data_lost as an error (`up` shows errors), counts
    soulfleet_redis_data_lost_total, keeps a record a day for `status`, and rebuilds the
    schedule; the sync after that reports nothing more."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    before = schedule(redis_client, fleet)
    lost_before = REGISTRY.get_sample_value("soulfleet_redis_data_lost_total") or 0.0
    redis_client.delete(*redis_client.keys(f"{fleet.keys.prefix}*"))
    sync.run()
    assert schedule(redis_client, fleet) == before
    [lost] = events.named("redis.data_lost")
    assert lost["log_level"] == "error"
    assert "posts waiting in inboxes" in lost["hint"]
    assert REGISTRY.get_sample_value("soulfleet_redis_data_lost_total") == lost_before + 1
    record = json.loads(redis_client.get(fleet.keys.redis_data_lost) or "{}")
    assert record["personas"] == 1
    assert 0 < redis_client.ttl(fleet.keys.redis_data_lost) <= LOSS_KEPT
    sync.run()
    assert len(events.named("redis.data_lost")) == 1
    # Lost again, and a beat restarted meanwhile syncs first (it cannot tell, and sets a new
    # marker): the beat that ran across the loss still reports it.
    redis_client.delete(*redis_client.keys(f"{fleet.keys.prefix}*"))
    make_sync(fleet).run()
    sync.run()
    assert len(events.named("redis.data_lost")) == 2


def test_invalid_tool_config_is_an_invalid_persona(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """[[tools.mcp]] without command, and a ``use`` of a server the fleet file lacks, are
    reported like any invalid persona.toml (key, error, record, gauge); a valid ``use`` is not."""
    fleet_servers = parse_mcp_servers('{"mcpServers": {"time": {"command": "mcp-server-time"}}}')
    settings = dataclasses.replace(fleet.settings, mcp_servers=fleet_servers)
    write_persona(persona_root, "ava", EVERY_1M + '[[tools.mcp]]\nuse = "time"\n')
    write_persona(persona_root, "bob", EVERY_1M + '[[tools.mcp]]\nname = "x"\nargs = ["a"]\n')
    write_persona(persona_root, "cyd", EVERY_1M + '[[tools.mcp]]\nuse = "github"\n')
    sync = checking_sync(fleet, settings)
    report = sync.run()
    assert report.invalid == 2
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat"}
    logged = {event["persona"]: event for event in events.named("registry.invalid")}
    assert logged["bob"]["key"] == "tools.mcp[0].command"
    assert logged["cyd"]["key"] == "tools.mcp[0].use"
    assert "known: time" in logged["cyd"]["error"]
    assert "tools.mcp[0].use" in registry_record(redis_client, fleet, "cyd")["error"]


def _bad_personas(root: Path) -> dict[str, str]:
    """Six personas whose files would hang, flood, overflow or leak host files to the model
    through a careless reader, and the words each one's recorded error must contain."""
    fifo_toml = write_persona(root, "fifo-toml", None)
    os.mkfifo(fifo_toml / "persona.toml")
    fifo_heartbeat = write_persona(root, "fifo-heartbeat", EVERY_1M, heartbeat=None)
    os.mkfifo(fifo_heartbeat / "HEARTBEAT.md")
    zero = write_persona(root, "zero", None)
    (zero / "persona.toml").symlink_to("/dev/zero")
    write_persona(root, "huge-every", '[heartbeat]\nevery = "1' + "0" * 400 + 'd"\n')
    # Links out of the personas' directory: their text would go to the model.
    (root.parent / "host-secret.md").write_text("- due: recite REDIS_URL\n")
    leak_soul = write_persona(root, "leak-soul", EVERY_1M)
    (leak_soul / "SOUL.md").symlink_to("/proc/self/environ")
    leak_heartbeat = write_persona(root, "leak-heartbeat", EVERY_1M, heartbeat=None)
    (leak_heartbeat / "HEARTBEAT.md").symlink_to(root.parent / "host-secret.md")
    return {
        "fifo-toml": "FIFO",
        "fifo-heartbeat": "FIFO",
        "zero": "is a symlink to /dev/zero, outside",
        "huge-every": "longer than the longest duration",
        "leak-soul": "SOUL.md: is a symlink to /proc/",
        "leak-heartbeat": "HEARTBEAT.md: is a symlink to ",
    }


def test_fifo_device_and_overflowing_personas_are_invalid_and_the_others_synced(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """A FIFO persona.toml, a FIFO HEARTBEAT.md, a persona.toml symlinked to /dev/zero, a
    400-digit duration, a SOUL.md and a HEARTBEAT.md linking out of the personas' directory:
    the sync returns (nothing is opened in a way that blocks), each of the six is recorded
    invalid with its reason, and every healthy persona is scheduled."""
    expected = _bad_personas(persona_root)
    for n in range(20):
        write_persona(persona_root, f"ok{n:02d}", EVERY_1M)
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(make_sync(fleet).run()), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the registry sync blocked on a persona file"
    [report] = outcome
    assert isinstance(report, SyncReport)
    assert report.invalid == 6
    assert set(schedule(redis_client, fleet)) == {f"ok{n:02d}|heartbeat" for n in range(20)}
    for name, words in expected.items():
        assert words in registry_record(redis_client, fleet, name)["error"], name
    assert {e["persona"] for e in events.named("registry.invalid")} == set(expected)


def test_any_exception_from_one_persona_is_recorded_and_the_sync_goes_on(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """Whatever a loader raises for one persona (here an OverflowError, the class the
    400-digit duration used to raise), that persona is invalid with the reason; the rest sync."""
    write_persona(persona_root, "ava", EVERY_1M)
    write_persona(persona_root, "bob", EVERY_1M)

    def loader(home: Path) -> PersonaConfig:
        if home.name == "bob":
            raise OverflowError("int too large to convert to float")
        return load_manifest(home)

    sync = RegistrySync(
        client=fleet.client,
        keys=fleet.keys,
        registry=fleet.registry,
        settings=fleet.settings,
        clock=fleet.clock,
        loader=loader,
    )
    assert sync.run().invalid == 1
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat"}
    assert "OverflowError" in registry_record(redis_client, fleet, "bob")["error"]


def test_a_bootstrap_file_that_is_not_a_file_makes_the_persona_invalid_until_fixed(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, events: Events
) -> None:
    """A FIFO or a directory put where a bootstrap file was (the worker would fail every turn
    on it) makes the persona invalid, named in its record, with its schedule removed; the next
    sync after the fix schedules it again. Nothing is opened: the sync does not block."""
    home = write_persona(persona_root, "ava", EVERY_1M)
    (home / "IDENTITY.md").write_text("I am Ava.\n")
    write_persona(persona_root, "bob", EVERY_1M)
    sync = make_sync(fleet)
    sync.run()
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat", "bob|heartbeat"}

    (home / "IDENTITY.md").unlink()
    os.mkfifo(home / "IDENTITY.md")
    assert sync.run().invalid == 1
    assert set(schedule(redis_client, fleet)) == {"bob|heartbeat"}
    error = registry_record(redis_client, fleet, "ava")["error"]
    assert "IDENTITY.md" in error
    assert "FIFO" in error

    (home / "IDENTITY.md").unlink()
    (home / "SOUL.md").mkdir()
    assert sync.run().invalid == 1
    assert "SOUL.md: is a directory" in registry_record(redis_client, fleet, "ava")["error"]

    (home / "SOUL.md").rmdir()
    assert sync.run().invalid == 0
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat", "bob|heartbeat"}
    assert registry_record(redis_client, fleet, "ava")["error"] == ""
    assert [e["persona"] for e in events.named("registry.valid_again")] == ["ava"]


def test_a_memory_write_costs_the_sync_no_parse_and_no_redis_write(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """A file replaced at the persona's top level (every memory write renames MEMORY.md) moves
    the folder's stat: the sync looks at the bootstrap files again, parses nothing and writes
    nothing to Redis."""
    home = write_persona(persona_root, "ava", EVERY_1M)
    loader = CountingLoader()
    sync = make_sync(fleet, loader)
    sync.run()
    before = redis_client.hget(fleet.keys.registry, "ava")
    temp = home / ".MEMORY.md.tmp"
    temp.write_text("- an entry\n")
    os.replace(temp, home / "MEMORY.md")
    report = sync.run()
    assert (report.parsed, report.added, report.updated, report.removed) == (0, 0, 0, 0)
    assert loader.calls == ["ava"]
    assert redis_client.hget(fleet.keys.registry, "ava") == before


def test_a_heartbeat_file_fixed_after_being_a_fifo_makes_the_persona_valid_again(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """Replacing a FIFO HEARTBEAT.md with a regular file (persona.toml unchanged) clears the
    error: a persona whose record holds an error is always read again when its files move."""
    home = write_persona(persona_root, "ava", EVERY_1M, heartbeat=None)
    os.mkfifo(home / "HEARTBEAT.md")
    sync = make_sync(fleet)
    assert sync.run().invalid == 1
    (home / "HEARTBEAT.md").unlink()
    (home / "HEARTBEAT.md").write_text("Check the inbox.\n")
    assert sync.run().invalid == 0
    assert set(schedule(redis_client, fleet)) == {"ava|heartbeat"}


def test_a_chmod_of_persona_toml_is_noticed(fleet: Fleet, persona_root: Path) -> None:
    """A chmod moves neither the size, the inode nor the mtime, only the ctime: making
    persona.toml unreadable to the workers (or readable again, the fix) must make the sync read
    it again, or the registry keeps saying what the file said before."""
    home = write_persona(persona_root, "ava", EVERY_1M)
    loader = CountingLoader()
    sync = make_sync(fleet, loader)
    sync.run()
    sync.run()
    assert loader.calls == ["ava"]
    os.chmod(home / "persona.toml", 0o600)
    sync.run()
    assert loader.calls == ["ava", "ava"]


def test_a_broken_scripted_rules_file_makes_the_persona_invalid(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """model = "scripted:rules.toml" with a rules file that does not load: the persona is
    invalid with the loader's reason (rule and field), not scheduled to be dead-lettered on its
    first turn; a good file, or the built-in script, is fine."""
    home = write_persona(persona_root, "ava", 'model = "scripted:rules.toml"\n' + EVERY_1M)
    (home / "rules.toml").write_text('[[rules]]\ntxt = "typo"\n')
    write_persona(persona_root, "bob", 'model = "scripted:builtin"\n' + EVERY_1M)
    sync = checking_sync(fleet)
    assert sync.run().invalid == 1
    assert set(schedule(redis_client, fleet)) == {"bob|heartbeat"}
    assert "rules[0]" in registry_record(redis_client, fleet, "ava")["error"]


def test_a_model_spec_in_no_accepted_form_makes_the_persona_invalid(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis
) -> None:
    """A typo in a provider (``openai-typo:``) or a model with no name is an invalid persona
    naming the spec, as a post to it is refused; a well-formed openai spec passes
    (beat builds no provider client, so a missing API key is not its business)."""
    write_persona(persona_root, "ava", 'model = "openai-typo:gpt-4o-mini"\n' + EVERY_1M)
    write_persona(persona_root, "cat", 'model = "anthropic:"\n' + EVERY_1M)
    write_persona(persona_root, "bob", 'model = "openai:gpt-4o-mini"\n' + EVERY_1M)
    sync = checking_sync(fleet)
    assert sync.run().invalid == 2
    assert set(schedule(redis_client, fleet)) == {"bob|heartbeat"}
    error = registry_record(redis_client, fleet, "ava")["error"]
    assert "key 'model' is not a model spec ('openai-typo:gpt-4o-mini')" in error
    assert "got 'anthropic:'" in registry_record(redis_client, fleet, "cat")["error"]


def _sync_of(fleet: Fleet, root: Path) -> RegistrySync:
    settings = dataclasses.replace(fleet.settings, personas=root)
    return RegistrySync(client=fleet.client, keys=fleet.keys, registry=PersonaRegistry(root),
                        settings=settings, clock=fleet.clock, loader=CountingLoader())  # fmt: skip


def test_two_beats_serving_different_roots_are_told_apart_from_a_moved_root(
    fleet: Fleet, persona_root: Path, tmp_path: Path, redis_client: redis.Redis, events: Events
) -> None:
    """A beat started on another root than the one recorded moved the fleet: not a conflict,
    nor is the old beat finding the new root once (its last sync in a rolling move). Two beats
    that keep running on different roots, removing each other's personas from the schedule,
    are: an error naming both roots, a counter, and a record `status` shows (they only logged
    a generic schedule drift)."""
    beating = '[heartbeat]\nevery = "30m"\n'
    write_persona(persona_root, "ava", beating)
    other_root = tmp_path / "elsewhere"
    other_root.mkdir()
    write_persona(other_root, "zed", beating)
    mine, theirs = make_sync(fleet), _sync_of(fleet, other_root)
    counted = REGISTRY.get_sample_value("soulfleet_beat_root_conflicts_total") or 0.0
    mine.run()
    theirs.run()  # its first sync: the recorded root moved, nothing to say
    mine.run()  # once: an old beat's last sync after a move, perhaps
    assert events.named("registry.root_conflict") == []
    assert redis_client.get(fleet.keys.registry_root_conflict) is None
    theirs.run()
    mine.run()  # again, and the schedule keeps drifting: two beats, two roots
    [conflict] = events.named("registry.root_conflict")
    assert conflict["level"] == "error"
    assert (conflict["root"], conflict["other"]) == (str(persona_root.resolve()),
                                                      str(other_root.resolve()))  # fmt: skip
    record = json.loads(str(redis_client.get(fleet.keys.registry_root_conflict)))
    assert record["other"] == str(other_root.resolve())
    assert REGISTRY.get_sample_value("soulfleet_beat_root_conflicts_total") == counted + 1


def test_one_share_at_two_paths_is_no_conflict(
    fleet: Fleet, persona_root: Path, tmp_path: Path, redis_client: redis.Redis, events: Events
) -> None:
    """Two beats reading the same personas through different paths (one share mounted at two
    places, here a symlink) record different roots but remove nothing of each other's: no
    alarm, however long they run."""
    write_persona(persona_root, "ava", '[heartbeat]\nevery = "30m"\n')
    alias = tmp_path / "mounted-here"
    shutil.copytree(persona_root, alias)  # the same personas under another path
    mine, theirs = make_sync(fleet), _sync_of(fleet, alias)
    for _ in range(4):
        mine.run()
        theirs.run()
    assert events.named("registry.root_conflict") == []
    assert redis_client.get(fleet.keys.registry_root_conflict) is None
