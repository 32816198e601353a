"""Registry sync: the personas root on disk becomes schedule entries in Redis, without restarts.

Why it is shaped like this:

- Cheap when nothing changed. Each persona has a fingerprint (inode, mtime, ctime and size of
  persona.toml and HEARTBEAT.md: the ctime catches a chmod); a persona whose persona.toml stat
  is unchanged is not re-parsed, and Redis is only written for personas whose fingerprint
  moved. A sync of 100,000 unchanged personas is a directory scan plus three ``stat`` calls
  each (persona.toml, HEARTBEAT.md, and the directory itself: when a file at its top level
  was created, removed or replaced, the bootstrap files are checked with a ``stat`` each).
- Idempotent and safe to run from several beats at once. A new entry is scored at its first
  grid slot (a stable per-lane phase, :mod:`beat.schedule`); a CHANGED spec is re-scored from
  now; an unchanged spec is left alone. Specs are canonical JSON and the slot arithmetic is
  deterministic, so two beats syncing the same directory write the same values or nothing.
- An invalid persona (persona.toml that does not parse, a cron expression that cannot fire, an
  overflowing duration, a persona.toml, HEARTBEAT.md or bootstrap file that is a FIFO, a
  device, a directory or too large;
  whatever exception its files cause) is reported — log ``registry.invalid`` (persona, key,
  error), its ``Keys.registry`` record's
  ``error``, the ``soulfleet_registry_invalid_personas`` gauge — and its schedule entries are
  REMOVED until the file is fixed. Keeping them would tick a persona whose turns can only fail
  (the worker reads the same file), and a lane that fails ``SOULFLEET_MAX_ATTEMPTS`` times is
  dead-lettered: a typo would end with an operator reviving lanes. Removal costs nothing to
  undo: the grid is deterministic, so the fixed persona resumes its old cadence. Other personas
  are never affected.
- The first sync of a process reconciles fully: entries whose persona directory vanished while
  no beat was running are removed too; so does any sync that finds Redis holding a different
  number of entries than the files ask for (a flushed or hand-edited Redis heals itself).
- Writing is :mod:`beat.entries`' job (compare, then write only differences); this module
  owns reading the disk.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
import structlog

from beat import metrics as beat_metrics
from beat.cron import CronError
from beat.entries import EntryChanges, PersonaEntries, ScheduleEntries
from beat.schedule import ScheduleSpec, specs_for
from workers.fleet.door_settings import fleet_settings_record
from workers.fleet.keys import Keys
from workers.fleet.registry import PersonaRegistry
from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import ModelSpecError, PersonaError, PersonaFileError, PersonaNotFound
from workers.persona.files import persona_file_problem
from workers.persona.home import BOOTSTRAP_ORDER
from workers.persona.manifest import MANIFEST_NAME, PersonaConfig, load_manifest
from workers.persona.mcp_servers import check_uses
from workers.persona.models.config import ModelConfig
from workers.persona.models.spec import BUILTIN, resolve_model
from workers.persona.spend import HEARTBEAT_FILE
from workers.settings import Settings

__all__ = ["HEARTBEAT_FILE", "RECONCILE_EVERY", "PersonaRecord", "RegistrySync", "SyncReport"]

_log = structlog.get_logger("soulfleet.beat")

#: Syncs in a row that must find another beat's root, serving other personas, before it is a
#: conflict: an old beat's last sync during a rolling move is not one.
_ROOT_CONFLICT_SYNCS = 2
#: Seconds in which a beat's syncs have compared every persona's registry record in Redis
#: with its own, a slice per sync (:meth:`RegistrySync._records_others_left`).
RECONCILE_EVERY = 300.0

Loader = Callable[[Path], PersonaConfig]


@dataclass(frozen=True, slots=True)
class PersonaRecord:
    """What the last sync knew about one persona directory."""

    fingerprint: str
    manifest_print: str
    specs: tuple[ScheduleSpec, ...]
    error: str = ""
    key: str = ""
    #: The persona directory's own stat: a file created, removed or swapped at its top level
    #: (a FIFO or a directory put where a bootstrap file was) moves it. Kept here only, not in
    #: Redis: every memory write moves it too, and most such moves change nothing.
    folder_print: str = ""

    def entries(self) -> PersonaEntries:
        return PersonaEntries(self.specs, self.fingerprint, self.error)


@dataclass(slots=True)
class SyncReport:
    """Counts from one sync pass (also logged as ``registry.synced``)."""

    personas: int = 0
    lanes: int = 0
    parsed: int = 0
    added: int = 0
    updated: int = 0
    removed: int = 0
    invalid: int = 0
    seconds: float = 0.0
    invalid_names: list[str] = field(default_factory=list)


def _check_scripted(config: PersonaConfig, home: Path) -> None:
    """Load every ``scripted:<path>`` rules file persona.toml names (its model and its
    per-kind models): a broken one is a ModelSpecError naming the rule and field, reported
    like any invalid persona, instead of a lane dead-lettered on its first turn. Only scripted
    specs: beat never builds provider clients."""
    specs = [config.model]
    specs += [kind.model for kind in (config.heartbeat, config.dream) if kind and kind.model]
    for spec in specs:
        provider, _, rest = spec.partition(":")
        if provider.strip().lower() == "scripted" and rest.strip() != BUILTIN:
            resolve_model(spec, ModelConfig(), base_dir=home)


def _unusable_bootstrap_file(path: str) -> tuple[str, str] | None:
    """The first bootstrap file that is there but not a regular file or links out of the
    personas' directory, and why (stat only)."""
    for name in BOOTSTRAP_ORDER:
        problem = persona_file_problem(path, name)
        if problem is not None:
            return name, problem
    return None


def _stat_print(path: str) -> str:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "-"
    except OSError as exc:  # unreadable (EACCES, ELOOP...): changes when it is fixed
        return f"!{exc.errno}"
    # The inode too: editors that save by renaming a new file over the old one change it even
    # when the new file has the same size within the same coarse mtime tick. The ctime for a
    # chmod (a persona.toml made unreadable, or readable again), which moves nothing else.
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_size}"


class RegistrySync:
    """Keeps ``Keys.schedule`` / ``schedule_spec`` / ``registry`` in step with the personas root."""

    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        registry: PersonaRegistry,
        settings: Settings,
        clock: Clock | None = None,
        loader: Loader | None = None,
    ) -> None:
        self._entries = ScheduleEntries(client, keys, registry.root)
        self._registry = registry
        self._settings = settings
        self._clock: Clock = clock or SystemClock()
        self._loader = loader or self._load
        self._known: dict[str, PersonaRecord] = {}
        self._reported_names: set[str] = set()
        self._reconciled = False
        #: The last persona of the previous slice of :meth:`_records_others_left` ('': the
        #: next slice starts at the first name).
        self._slice_after = ""
        #: The marker's value at the previous sync (None before the first).
        self._marker: str | None = None
        #: Whether this beat has recorded its root (a sync after that finding another's may be
        #: a conflict; the first finding another is a root that moved), and for how many syncs
        #: in a row another beat's root, serving other personas, replaced it.
        self._recorded_root = False
        self._root_replaced = 0

    @property
    def registered_lanes(self) -> int:
        """Lanes of the personas seen by the newest sync: one each, plus one per dreamer."""
        return sum(
            1 + sum(1 for spec in record.specs if spec.kind == "dream")
            for record in self._known.values()
        )

    def run(self) -> SyncReport:
        """One pass: scan, re-parse what changed, write only the differences."""
        started = time.perf_counter()
        report = SyncReport()
        seen = self._scan(report)
        self._check_root(set(seen))
        changed: dict[str, PersonaRecord] = {}
        for name in sorted(seen):
            record = self._examine(name, seen[name], report)
            if record is not None:
                changed[name] = record
        gone = {name for name in self._known if name not in seen}
        current = {name: r for name, r in self._known.items() if name in seen} | changed
        targets = changed
        # What the previous sync left in Redis (this sync's changes are not written yet).
        expected = sum(len(record.specs) for record in self._known.values())
        drifted = self._reconciled and self._entries.drifted(expected)
        if drifted:
            # Heals itself below; a hand edit, another beat's write, or a loss of Redis's data
            # (which the marker below tells apart and reports as such).
            _log.warning(
                "schedule.drifted",
                expected=expected,
                hint="Redis does not hold the schedule entries the persona files ask for (a "
                "restart without AOF, FLUSHALL, a hand edit, another beat): rewritten from the "
                "files now",
            )
        self._check_marker(len(current))
        now = self._clock.time()
        if not self._reconciled or drifted:
            targets = current
            gone |= {name for name in self._entries.personas_in_redis() if name not in seen}
        else:
            targets = {**self._records_others_left(current), **changed}
        changes = EntryChanges()
        self._entries.apply(
            {name: record.entries() for name, record in targets.items()}, now, changes
        )
        self._entries.remove(gone, changes)
        self._reconciled = True
        self._known = current

        report.added, report.updated, report.removed = (
            changes.added,
            changes.updated,
            changes.removed,
        )
        report.personas = len(current)
        report.invalid = sum(1 for record in current.values() if record.error)
        report.lanes = self.registered_lanes
        self._entries.set_registered_lanes(report.lanes, fleet_settings_record(self._settings))
        self._recorded_root = True
        beat_metrics.REGISTRY_INVALID.set(report.invalid)
        report.seconds = time.perf_counter() - started
        busy = report.added or report.updated or report.removed or report.parsed
        (_log.info if busy else _log.debug)(
            "registry.synced",
            personas=report.personas,
            lanes=report.lanes,
            parsed=report.parsed,
            added=report.added,
            updated=report.updated,
            removed=report.removed,
            invalid=report.invalid,
            seconds=round(report.seconds, 4),
        )
        return report

    def _records_others_left(self, current: dict[str, PersonaRecord]) -> dict[str, PersonaRecord]:
        """The next slice of personas (all of them within :data:`RECONCILE_EVERY` seconds of
        syncs), whose entries and registry record are compared with this beat's and written
        back where they differ: another beat (one with another MCP config, or other jitter
        settings) left a persona recorded invalid, or its specs, without changing how many
        entries Redis holds, and this beat, whose files did not change, never wrote them back
        (status kept calling the persona invalid after that beat stopped)."""
        names = sorted(current)
        if not names:
            return {}
        syncs = max(1, int(RECONCILE_EVERY / max(self._settings.sync_interval, 0.1)))
        size = -(-len(names) // syncs)
        # By name, not index: personas added or removed between syncs shift every index.
        start = bisect.bisect_right(names, self._slice_after) if self._slice_after else 0
        if start >= len(names):
            start = 0
        chunk = names[start : start + size]
        # The pass's last slice may be short; the next pass starts at the top again.
        self._slice_after = "" if start + size >= len(names) else chunk[-1]
        return {name: current[name] for name in chunk}

    def _check_marker(self, personas: int) -> None:
        """Say so when the marker this beat saw (or set) at its last sync is gone or replaced
        (another beat found it gone first): Redis lost its data while beat ran (a restart
        without its AOF, FLUSHALL), and with it inbox items, running turns and today's usage.
        An error, so `up` shows it; counted, for the alert; kept a day, for `status`. A loss
        while beat was down too is not seen: a fresh Redis and an emptied one look alike
        (`redis.not_persistent` warns of it at every start)."""
        now = self._clock.time()
        marker = self._entries.mark()
        if self._marker is not None and marker != self._marker:
            _log.error(
                "redis.data_lost",
                error="the marker beat keeps in Redis is gone: Redis lost its data (a restart "
                "without its AOF, FLUSHALL)",
                hint="the schedule is rebuilt from the persona files; posts waiting in inboxes, "
                "running turns and today's token counts of that moment are lost (runbook: Redis "
                "down or restarted)",
            )
            beat_metrics.REDIS_DATA_LOST.inc()
            self._entries.record_loss(now, personas)
        self._marker = marker

    def _check_root(self, seen: set[str]) -> None:
        """Say so when another beat keeps recording another personas root where this one
        records its own, serving other personas: two beats on different roots each remove the
        other's personas from the schedule at every sync (heartbeats thinned out, and only a
        generic drift warning said anything). Checked before this sync writes anything, so
        Redis still holds what the other beat left. Not for a root found different at this
        beat's first sync (a move), nor for one seen once (an old beat's last sync in a
        rolling move), nor for the same personas under another path (one share mounted at two
        places: nothing is removed)."""
        mine = str(self._registry.root.expanduser().resolve())
        recorded = self._entries.recorded_root()
        fight = (
            self._recorded_root
            and recorded is not None
            and recorded != mine
            and self._entries.personas_in_redis() != seen
        )
        self._root_replaced = self._root_replaced + 1 if fight else 0
        if self._root_replaced < _ROOT_CONFLICT_SYNCS:
            return
        _log.error(
            "registry.root_conflict",
            root=mine,
            other=recorded,
            syncs=self._root_replaced,
            hint="another beat serves other personas from the other root: every beat of a "
            "fleet must have the same SOULFLEET_PERSONAS; stop or fix the one that is wrong",
        )
        beat_metrics.ROOT_CONFLICTS.inc()
        self._entries.record_root_conflict(str(recorded), self._clock.time())

    def _load(self, home: Path) -> PersonaConfig:
        """persona.toml, with its ``use`` of fleet MCP servers checked against the fleet file
        and its scripted rules files loaded."""
        config = load_manifest(home)
        check_uses(config.tools, self._settings.mcp_servers)
        _check_scripted(config, home)
        return config

    # -- disk -----------------------------------------------------------------------------
    def _scan(self, report: SyncReport) -> dict[str, str]:
        root = self._registry.root
        try:
            entries = list(os.scandir(root))
        except FileNotFoundError:
            # An error (`up` shows errors): every persona's schedule goes until it is back.
            _log.error(
                "registry.root_missing",
                root=str(root),
                error="the personas root does not exist: moved, renamed or unmounted",
                hint="no persona is scheduled until it is back; put it back, or restart the "
                "fleet with the new path (SOULFLEET_PERSONAS)",
            )
            return {}
        # Plain strings, not Paths, in this loop: at 100,000 personas pathlib's parsing costs
        # more than the stat calls themselves.
        seen: dict[str, str] = {}
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not entry.is_dir():
                continue
            if not self._registry.valid_name(name):
                report.invalid_names.append(name)
                if name not in self._reported_names:
                    self._reported_names.add(name)
                    _log.warning(
                        "registry.invalid_name",
                        persona=name,
                        error="not a usable persona name (letters, digits, . _ -; at most 64; "
                        "no '..'; not ending in -dreamer): directory skipped",
                    )
                continue
            seen[name] = entry.path
        return seen

    def _examine(self, name: str, path: str, report: SyncReport) -> PersonaRecord | None:
        """The persona's new record, or None when nothing about it changed."""
        manifest_print = _stat_print(os.path.join(path, MANIFEST_NAME))
        fingerprint = f"{manifest_print};{_stat_print(os.path.join(path, HEARTBEAT_FILE))}"
        folder_print = _stat_print(path)
        known = self._known.get(name)
        if known is not None and (known.fingerprint, known.folder_print) == (
            fingerprint,
            folder_print,
        ):
            return None
        unusable = _unusable_bootstrap_file(path)
        if known is not None and not known.error and unusable is None:
            if known.fingerprint == fingerprint:  # only the folder moved: nothing to write
                self._known[name] = dataclasses.replace(known, folder_print=folder_print)
                return None
            if known.manifest_print == manifest_print:
                return PersonaRecord(fingerprint, manifest_print, known.specs, "", "", folder_print)
        report.parsed += 1
        return self._parsed(name, Path(path), (fingerprint, manifest_print, folder_print), unusable)

    def _parsed(
        self,
        name: str,
        home: Path,
        prints: tuple[str, str, str],
        unusable: tuple[str, str] | None,
    ) -> PersonaRecord | None:
        """The record of a persona whose files are read again (None if it just vanished)."""
        fingerprint, manifest_print, folder_print = prints
        path = str(home)
        known = self._known.get(name)
        try:
            heartbeat_problem = persona_file_problem(path, HEARTBEAT_FILE)
            if heartbeat_problem is not None:
                # Stat only: a FIFO or a device must be refused without ever being opened.
                raise PersonaFileError(home / HEARTBEAT_FILE, heartbeat_problem)
            if unusable is not None:
                raise PersonaFileError(home / unusable[0], unusable[1])
            specs = specs_for(name, home, self._loader(home), self._settings)
        except PersonaNotFound:
            return None  # vanished between scan and parse: the next sync removes it
        except CronError as exc:
            problem = f"{home / MANIFEST_NAME}: key 'dream.cron' {exc}"
            failed = PersonaRecord(
                fingerprint, manifest_print, (), problem, "dream.cron", folder_print
            )
        except (PersonaError, ModelSpecError, ValueError) as exc:
            key = str(getattr(exc, "key", None) or "")
            failed = PersonaRecord(fingerprint, manifest_print, (), str(exc), key, folder_print)
        except Exception as exc:  # whatever one persona's files do, the others are synced
            problem = f"{home}: cannot be scheduled: {type(exc).__name__}: {exc}"
            failed = PersonaRecord(
                fingerprint, manifest_print, (), problem[:2000], "", folder_print
            )
        else:
            if known is not None and known.error:
                _log.info("registry.valid_again", persona=name)
            return PersonaRecord(fingerprint, manifest_print, specs, folder_print=folder_print)
        if known is None or known.error != failed.error:
            _log.warning("registry.invalid", persona=name, key=failed.key, error=failed.error)
        return failed
