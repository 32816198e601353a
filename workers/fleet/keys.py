"""Every Redis key soulfleet uses, built in this one module.

All keys share one prefix (``SOULFLEET_KEY_PREFIX``, default ``soulfleet:``) so several fleets
can share a Redis and an operator can find everything with one ``SCAN``. Celery's own broker
keys are namespaced separately through kombu's ``global_keyprefix`` (see workers/celery.py).

Per lane (a lane is one persona's turn sequence: ``ava`` or ``ava-dreamer``):

====================  ======  =============================================================
key                   type    holds
====================  ======  =============================================================
``lane:<lane>``       hash    state (idle|queued|running|dead), turn_id, kind, tick_kind,
                              fence, ticks, inflight_ticks, attempts, lost (crashes in this
                              run of attempts), last_error, last_error_at, last_turn,
                              last_status, last_text, last_note (why the newest turn ended
                              short, if it did), last_end, queued_at, started_at, worker,
                              last_error_kind, failing_since, failures, retry_at, provider,
                              session (the current session state file's name), session_epoch
                              (bumped by a session reset), last_post (ms of the newest inbound
                              post), last_pass (dreamer lanes: "<ended ms>:<began ms>" of the
                              newest pass that ran its model)
``inbox:<lane>``      list    JSON inbox items waiting for the next turn (bounded)
``inflight:<lane>``   list    items drained by the running turn, kept until it finishes
``lease:<lane>``      string  ``<fence>:<worker>``, PX TTL; the running turn's lease
``claim:<lane>``      string  ``<worker>|<turn id>``, PX TTL: a worker took the turn message
                              and has not started it yet (receive.lua; start deletes it)
====================  ======  =============================================================

Fleet-wide:

============================  ======  ======================================================
``lanes:queued``              zset    lane -> ms when its turn was queued (reaper, metrics)
``lanes:running``             zset    lane -> ms when its lease expires (reaper, metrics)
``lanes:dead``                zset    lane -> ms when it was dead-lettered
``lanes:retry``               zset    lane -> ms when its failed turn may run again (backoff)
``lanes:claimed``             zset    lane -> ms when a worker claimed its turn message
``deferred:<provider>``       zset    lane -> ms when its turn was parked by an open breaker
``breaker:<provider>``        hash    the provider breaker: state (closed|open), window counts,
                                      opened_at, probe_at, probe_until, last_error, totals
``breakers``                  set     providers with a breaker record
``beats``                     stream  surfaced heartbeat replies (MAXLEN ~ SOULFLEET_BEATS_MAX)
``gate``                      zset    model-call slot holder -> ms when the slot expires
``reply:<item id>``           list    the final text of the turn that consumed a ``run`` item
``schedule``                  zset    ``<lane>|<kind>`` -> ms when next due
``schedule:spec``             hash    ``<lane>|<kind>`` -> JSON schedule spec
``registry``                  hash    persona -> JSON {path, fingerprint, error}
``registry:lanes``            string  how many lanes the newest registry sync registered
``registry:root``             string  the personas root the newest registry sync scanned
``beat:last_sweep``           string  JSON summary of the newest sweep (liveness)
``usage:<day>:<persona>``     hash    one persona's model use on one day (its budget's
                                      time zone): tokens, input, output, cached,
                                      cache_write, calls; ``<field>|<model>`` per model;
                                      ``calls@<kind>``, ``tokens@<kind>`` per turn kind.
                                      Expires after SOULFLEET_USAGE_DAYS
``usage:top:<day>``           zset    persona -> tokens that day (top-K spenders)
``usage:call:<call id>``      string  marks a counted model call (PX 10 min: retries count once)
============================  ======  ======================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys", "schedule_member", "split_schedule_member"]


def schedule_member(lane: str, kind: str) -> str:
    """The schedule set's member for one (lane, kind) pair."""
    return f"{lane}|{kind}"


def split_schedule_member(member: str) -> tuple[str, str]:
    lane, _, kind = member.rpartition("|")
    return lane, kind


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builder for one fleet (one prefix)."""

    prefix: str = "soulfleet:"

    # -- per lane ---------------------------------------------------------------------------
    def lane(self, lane: str) -> str:
        return f"{self.prefix}lane:{lane}"

    def inbox(self, lane: str) -> str:
        return f"{self.prefix}inbox:{lane}"

    def inflight(self, lane: str) -> str:
        return f"{self.prefix}inflight:{lane}"

    def lease(self, lane: str) -> str:
        return f"{self.prefix}lease:{lane}"

    def claim(self, lane: str) -> str:
        return f"{self.prefix}claim:{lane}"

    def lane_keys(self, lane: str) -> list[str]:
        """KEYS for every lane transition script, in the order the scripts expect."""
        return [
            self.lane(lane),
            self.inbox(lane),
            self.inflight(lane),
            self.lease(lane),
            self.queued,
            self.running,
            self.dead,
        ]

    # -- fleet-wide -------------------------------------------------------------------------
    @property
    def queued(self) -> str:
        return f"{self.prefix}lanes:queued"

    @property
    def running(self) -> str:
        return f"{self.prefix}lanes:running"

    @property
    def dead(self) -> str:
        return f"{self.prefix}lanes:dead"

    @property
    def retry(self) -> str:
        return f"{self.prefix}lanes:retry"

    @property
    def claimed(self) -> str:
        return f"{self.prefix}lanes:claimed"

    def deferred(self, provider: str) -> str:
        return f"{self.prefix}deferred:{provider}"

    def breaker(self, provider: str) -> str:
        return f"{self.prefix}breaker:{provider}"

    @property
    def breakers(self) -> str:
        return f"{self.prefix}breakers"

    @property
    def beats(self) -> str:
        return f"{self.prefix}beats"

    @property
    def gate(self) -> str:
        return f"{self.prefix}gate"

    def reply(self, item_id: str) -> str:
        return f"{self.prefix}reply:{item_id}"

    @property
    def schedule(self) -> str:
        return f"{self.prefix}schedule"

    @property
    def schedule_spec(self) -> str:
        return f"{self.prefix}schedule:spec"

    @property
    def schedule_epoch(self) -> str:
        """Bumped by every write to :attr:`schedule_spec`: sweeps re-read specs when it moves."""
        return f"{self.prefix}schedule:epoch"

    @property
    def registry(self) -> str:
        return f"{self.prefix}registry"

    @property
    def registry_lanes(self) -> str:
        return f"{self.prefix}registry:lanes"

    @property
    def registry_root(self) -> str:
        return f"{self.prefix}registry:root"

    @property
    def registry_root_conflict(self) -> str:
        """JSON ``{root, other, at}`` a beat writes (for a few minutes) when it finds the root
        it records replaced by another beat's: two beats serving different personas roots."""
        return f"{self.prefix}registry:root_conflict"

    @property
    def registry_settings(self) -> str:
        """JSON of the fleet's door settings as beat reads them (daily budget, inbox limits):
        the CLI shows and checks by them, not by its own shell's environment. (Named for what
        it first held: a CLI and a beat of different versions still meet on it.)"""
        return f"{self.prefix}registry:spend"

    @property
    def inbox_rejects(self) -> str:
        """Posts refused by a full inbox, fleet-wide (INCR): beat exports it, since the process
        that posted (a CLI, a host app) is seldom one Prometheus scrapes."""
        return f"{self.prefix}stats:inbox_rejects"

    @property
    def last_sweep(self) -> str:
        return f"{self.prefix}beat:last_sweep"

    @property
    def fleet_marker(self) -> str:
        """Set by beat's first registry sync (NX): gone later, Redis lost its data."""
        return f"{self.prefix}beat:marker"

    @property
    def redis_data_lost(self) -> str:
        """JSON beat writes when it found :attr:`fleet_marker` gone (kept a day)."""
        return f"{self.prefix}beat:redis_data_lost"

    def usage(self, day: str, persona: str) -> str:
        return f"{self.prefix}usage:{day}:{persona}"

    def usage_top(self, day: str) -> str:
        return f"{self.prefix}usage:top:{day}"

    def usage_call(self, call_id: str) -> str:
        return f"{self.prefix}usage:call:{call_id}"

    def pattern(self) -> str:
        """A SCAN pattern matching every key of this fleet (tests use it to clean up)."""
        return f"{self.prefix}*"
