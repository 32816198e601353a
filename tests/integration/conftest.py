"""A real fleet per test: personas on disk, real celery workers (and beat), the test's own Redis
prefix, and a :class:`Fleet` host handle in the test process built from the same settings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.fleet import (
    FleetProcess,
    fleet_env,
    openai_env,
    read_events,
    start_beat,
    start_worker,
    stop_all,
    wait_until,
)
from tests.support.providers import FakeProvider
from workers.fleet import Fleet
from workers.publisher import connect
from workers.settings import Settings


@dataclass
class Harness:
    """Personas, processes and a host-side Fleet for one integration test."""

    root: Path
    logs: Path
    env: dict[str, str]
    processes: list[FleetProcess] = field(default_factory=list)
    _fleet: Fleet | None = None

    def configure(self, **values: str) -> None:
        """Set fleet environment variables (before starting processes or using ``fleet``)."""
        assert self._fleet is None, "configure before the first use of harness.fleet"
        self.env.update(values)

    def use_model_server(self, server: FakeProvider, **values: str) -> None:
        """Configure the fleet's default model ``openai:talk`` and every other ``openai:`` model
        to be served by ``server`` (no retry inside a call), plus ``values``."""
        self.configure(**openai_env(server), SOULFLEET_MODEL="openai:talk", **values)

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    @property
    def fleet(self) -> Fleet:
        if self._fleet is None:
            self._fleet = connect(self.settings)
        return self._fleet

    def persona(
        self,
        name: str,
        *,
        rules: str | None = None,
        toml: str = "",
        files: dict[str, str] | None = None,
    ) -> Path:
        """Write a persona home; ``rules`` (scripted-model TOML) becomes its model."""
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        (home / "SOUL.md").write_text(f"You are {name}.\n", encoding="utf-8")
        manifest = toml
        if rules is not None:
            (home / "rules.toml").write_text(rules, encoding="utf-8")
            manifest = f'model = "scripted:rules.toml"\n{toml}'
        if manifest:
            (home / "persona.toml").write_text(manifest, encoding="utf-8")
        for filename, text in (files or {}).items():
            (home / filename).write_text(text, encoding="utf-8")
        return home

    def worker(self, name: str = "w1", **kwargs: Any) -> FleetProcess:
        process = start_worker(self.env, self.logs, name=name, **kwargs)
        self.processes.append(process)
        return process

    def beat(self, name: str = "beat", **kwargs: Any) -> FleetProcess:
        process = start_beat(self.env, self.logs, name=name, **kwargs)
        self.processes.append(process)
        return process

    def events(self, event: str, **match: Any) -> list[dict[str, Any]]:
        """``event`` records from every process log, oldest first, filtered by ``match``."""
        found: list[dict[str, Any]] = []
        for path in sorted(self.logs.glob("*.log")):
            for record in read_events(path, event):
                if all(record.get(key) == value for key, value in match.items()):
                    record["_process"] = path.stem
                    found.append(record)
        return sorted(found, key=lambda record: float(record.get("at", record.get("ts", 0))))

    def drain(self, timeout: float) -> None:
        """Wait until no lane is queued or running, re-publishing lost messages as beat's
        reaper would (beat is stopped by now); on a timeout, print a few lanes still stuck."""
        fleet = self.fleet

        def drained() -> bool:
            fleet.reap()
            counts = fleet.lanes.counts()
            return counts["queued"] + counts["running"] == 0

        try:
            wait_until(drained, timeout=timeout, interval=0.5, what="every lane to go idle")
        except AssertionError:
            client, keys = fleet.client, fleet.keys
            stuck = [*client.zrange(keys.queued, 0, 2), *client.zrange(keys.running, 0, 2)]
            print("stuck lanes:", [fleet.lanes.status(str(lane)) for lane in stuck])
            raise

    def answered(self, persona: str, text: str, *, timeout: float, what: str) -> None:
        """Post ``text`` to ``persona`` and wait until its lane's newest turn is done."""
        self.fleet.post(persona, text)
        wait_until(
            lambda: self.fleet.status(persona).get("last_status") == "done",
            timeout=timeout,
            what=what,
        )

    def stop(self) -> None:
        stop_all(self.processes)


@pytest.fixture
def harness(
    tmp_path: Path, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> Iterator[Harness]:
    root = tmp_path / "personas"
    root.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    env = fleet_env(redis_url=redis_url, key_prefix=key_prefix, personas=root)
    harness = Harness(root=root, logs=logs, env=env)
    try:
        yield harness
    finally:
        harness.stop()
        if harness._fleet is not None:
            harness._fleet.client.close()
