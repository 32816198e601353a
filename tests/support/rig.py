"""The in-process turn rig: a real Fleet, Renewer, Gate and TurnExecutor on a real Redis, with a
recording publisher standing in for the broker (the integration tests cover the broker).

A test file builds its own ``Rig`` as a subclass of :class:`TurnRig` (adding what it needs,
e.g. the model server and the clock) from :func:`turn_engine`, which differs per file only in
the settings it is given, the gate's limit and the fleet's clock::

    with turn_engine(redis_url, key_prefix, tmp_path, env, gate_limit=1) as engine:
        yield Rig(*engine, tmp_path, provider)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from workers.fleet import Fleet
from workers.fleet.gate import Gate
from workers.fleet.lease import Renewer
from workers.persona.clock import Clock
from workers.settings import Settings
from workers.turn import TurnExecutor

__all__ = [
    "Recorder",
    "TurnEngine",
    "TurnRig",
    "turn_engine",
    "write_persona",
]


@dataclass
class Recorder:
    """A Publisher that keeps every (lane, turn id, kind) it is asked to send, in order."""

    sent: list[tuple[str, str, str]] = field(default_factory=list)

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        self.sent.append((lane, turn_id, kind))

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        self.sent.extend(turns)


class TurnEngine(NamedTuple):
    """What :func:`turn_engine` builds: the first three fields of every :class:`TurnRig`."""

    fleet: Fleet
    executor: TurnExecutor
    published: Recorder


@dataclass
class TurnRig:
    """A fleet whose published turns the test runs itself; personas live under ``root``."""

    fleet: Fleet
    executor: TurnExecutor
    published: Recorder
    root: Path

    def run_next(self) -> str:
        """Run the most recently published turn; return its outcome."""
        lane, turn_id, _ = self.published.sent.pop()
        return self.executor.execute(lane, turn_id).outcome

    def run_all(self) -> list[str]:
        """Run every published turn (and the follow-ups they publish); their outcomes."""
        outcomes = []
        while self.published.sent:
            lane, turn_id, _ = self.published.sent.pop(0)
            outcomes.append(self.executor.execute(lane, turn_id).outcome)
        return outcomes


@contextmanager
def turn_engine(
    redis_url: str,
    key_prefix: str,
    root: Path,
    env: Mapping[str, str],
    *,
    gate_limit: int,
    clock: Clock | None = None,
) -> Iterator[TurnEngine]:
    """A fleet on ``key_prefix`` with personas under ``root``, ``env`` added to its settings;
    the renewer is stopped and the client closed on exit."""
    settings = Settings.from_env(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_KEY_PREFIX": key_prefix,
            "SOULFLEET_PERSONAS": str(root),
            **env,
        }
    )
    published = Recorder()
    fleet = Fleet(settings, publisher=published, clock=clock)
    renewer = Renewer(fleet.lanes)
    gate = Gate(fleet.client, fleet.keys, limit=gate_limit, slot_ttl=30, renewer=renewer)
    executor = TurnExecutor(settings, fleet, renewer, gate, worker_id="test-worker")
    try:
        yield TurnEngine(fleet, executor, published)
    finally:
        renewer.stop()
        fleet.client.close()


def write_persona(
    root: Path, name: str, model: str, toml: str = "", /, *, soul: str | None = None, **files: str
) -> Path:
    """A persona home ``root/name`` whose persona.toml names ``model`` (then ``toml``), with
    SOUL.md holding ``soul`` if given and ``files`` keyword-friendly: HEARTBEAT_md is
    HEARTBEAT.md."""
    home = root / name
    home.mkdir()
    if soul is not None:
        (home / "SOUL.md").write_text(soul)
    (home / "persona.toml").write_text(f'model = "{model}"\n{toml}')
    for filename, text in files.items():
        (home / filename.replace("_", ".")).write_text(text)
    return home
