"""Helpers for CLI tests: environments, the demo personas, and `soulfleet` subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.usage import UsageLedger
from workers.local.demo import install_demo
from workers.local.redis_server import free_port
from workers.persona.messages import Usage
from workers.settings import Settings

__all__ = [
    "PASSWORD",
    "cli_environ",
    "closed_port_url",
    "commit_turn",
    "copy_demo",
    "dead_letter",
    "descendants",
    "lanes_for",
    "reaping",
    "run_soulfleet",
    "settings_for",
    "soulfleet_argv",
    "subprocess_env",
    "sync_registry",
]

PASSWORD = "s3cret-pa55"


def closed_port_url() -> str:
    """A Redis URL with a password, on a loopback port nothing listens on."""
    return f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"


def copy_demo(root: Path) -> Path:
    """``root`` holding a fresh copy of the packaged demo personas."""
    install_demo(root)
    return root


def cli_environ(
    base: Mapping[str, str],
    *,
    redis_url: str,
    key_prefix: str,
    personas: Path,
    data_home: Path,
) -> dict[str, str | None]:
    """CliRunner's env: every inherited SOULFLEET_/CELERY_/model variable unset, ours set."""
    env: dict[str, str | None] = {
        name: None
        for name in base
        if name.startswith(("SOULFLEET_", "CELERY_", "OPENAI_", "ANTHROPIC_"))
    }
    env.update(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_KEY_PREFIX": key_prefix,
            "SOULFLEET_QUEUE_PREFIX": key_prefix.rstrip(":").replace(":", "-"),
            "SOULFLEET_PERSONAS": str(personas),
            "XDG_DATA_HOME": str(data_home),
        }
    )
    return env


def subprocess_env(environ: Mapping[str, str | None]) -> dict[str, str]:
    """A full process environment from a CliRunner-style mapping (None = unset)."""
    env = dict(os.environ)
    for name, value in environ.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["PYTHONUNBUFFERED"] = "1"
    return env


def soulfleet_argv(*args: str) -> list[str]:
    """The installed `soulfleet` console script next to this interpreter (PATH may lack the
    venv), else the same entry point through ``-c``."""
    script = Path(sys.executable).parent / "soulfleet"
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "from workers.cli import main; main()", *args]


def run_soulfleet(
    *args: str, env: Mapping[str, str | None], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `soulfleet <args>` as a real process and capture its output."""
    return subprocess.run(
        soulfleet_argv(*args),
        env=subprocess_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def settings_for(environ: Mapping[str, str | None]) -> Settings:
    """The Settings a CLI command would build from a CliRunner-style env mapping."""
    return Settings.from_env(subprocess_env(environ))


def lanes_for(environ: Mapping[str, str | None]) -> Lanes:
    """Lanes on the test's Redis and prefix, to look at what a command did."""
    settings = settings_for(environ)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    return Lanes(
        client,
        Keys(settings.key_prefix),
        inbox_max=settings.inbox_max,
        lease_ttl=settings.lease_ttl,
        max_attempts=settings.max_attempts,
        beats_max=settings.beats_max,
        reply_ttl=settings.reply_ttl,
    )


class _NoPublisher:
    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        raise AssertionError("a registry sync publishes nothing")

    def publish_many(self, turns: object) -> None:
        raise AssertionError("a registry sync publishes nothing")


def sync_registry(environ: Mapping[str, str | None]) -> None:
    """One registry sync, exactly as beat runs it, on the test's Redis, prefix and personas."""
    from beat.sync import RegistrySync  # noqa: PLC0415 - beat only for the tests that sync
    from workers.fleet import Fleet  # noqa: PLC0415

    settings = settings_for(environ)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        fleet = Fleet(settings, client=client, publisher=_NoPublisher())
        RegistrySync(
            client=client, keys=fleet.keys, registry=fleet.registry, settings=settings
        ).run()
    finally:
        client.close()


def with_budget(fleet_root: Path, persona: str, daily_tokens: int) -> None:
    """Give ``persona`` a ``[budget] daily_tokens`` in its persona.toml."""
    toml = fleet_root / persona / "persona.toml"
    toml.write_text(
        toml.read_text("utf-8") + f"\n[budget]\ndaily_tokens = {daily_tokens}\n", "utf-8"
    )


def spend_today(environ: Mapping[str, str | None], persona: str, call_id: str, tokens: int) -> None:
    """Record a heartbeat model call of ``persona`` today (UTC) worth ``tokens`` + 1 tokens."""
    settings = settings_for(environ)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        ledger = UsageLedger(client, Keys(settings.key_prefix), days=settings.usage_days)
        ledger.record(call_id=call_id, usage=Usage(tokens, 1), persona=persona,
                      day=ledger.today("UTC"), model="openai:small", kind="heartbeat")  # fmt: skip
    finally:
        client.close()


def commit_turn(
    lanes: Lanes,
    lane: str,
    text: str,
    *,
    kind: str = "heartbeat",
    status: str = "done",
    note: str = "",
) -> str:
    """Run one real lane turn (tick, start, finish) that surfaces ``text`` as a beat unless it
    is a dreamer lane; return the turn id."""
    outcome = lanes.tick(lane, kind=kind)
    assert outcome.turn_id is not None, outcome
    started = lanes.start(lane, outcome.turn_id, "test-worker")
    assert started.status == "started", started
    beat = None
    if not lane.endswith("-dreamer"):
        beat = {"persona": lane, "text": text, "turn_id": outcome.turn_id, "time": "1700000000.5"}
    lanes.finish(lane, started.fence, status=status, text=text, beat=beat, note=note)
    return outcome.turn_id


def dead_letter(lanes: Lanes, lane: str, error: str = "boom") -> None:
    """Fail ``lane``'s turns until it is dead-lettered (max_attempts failures in a row)."""
    outcome = lanes.tick(lane, kind="dream" if lane.endswith("-dreamer") else "heartbeat")
    turn_id = outcome.turn_id
    for _ in range(lanes.max_attempts):
        assert turn_id is not None
        started = lanes.start(lane, turn_id, "test-worker")
        assert started.status == "started", started
        failed = lanes.fail(lane, started.fence, error=error)
        turn_id = failed.retry_turn_id
    assert lanes.status(lane)["state"] == "dead"


@dataclass(frozen=True, slots=True)
class Proc:
    """A process seen in /proc; ``start`` (clock ticks after boot) tells a reused pid apart."""

    pid: int
    ppid: int
    start: int
    cmdline: str

    def alive(self) -> bool:
        """Still running (a zombie or a new process under the same pid does not count)."""
        found = _read_proc(self.pid)
        return found is not None and found.start == self.start and found.state != "Z"


@dataclass(frozen=True, slots=True)
class _Stat:
    ppid: int
    start: int
    state: str


def _read_proc(pid: int) -> _Stat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    fields = raw[raw.rindex(")") + 2 :].split()
    return _Stat(ppid=int(fields[1]), start=int(fields[19]), state=fields[0])


def descendants(pid: int) -> list[Proc]:
    """Every live descendant of ``pid`` (children, grandchildren ...), from /proc."""
    table: dict[int, tuple[_Stat, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read_proc(int(entry.name))
        if stat is None:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = ""
        table[int(entry.name)] = (stat, cmd.strip())
    found: list[Proc] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (stat, cmd) in table.items():
            if stat.ppid == parent and stat.state != "Z":
                found.append(Proc(child, parent, stat.start, cmd))
                frontier.append(child)
    return found


@contextlib.contextmanager
def reaping(process: subprocess.Popen[Any]) -> Iterator[None]:
    """Whatever happens inside, nothing ``process`` started keeps running afterwards: if it
    still runs, its descendants are SIGKILLed first, then it; it is always waited for."""
    try:
        yield
    finally:
        if process.poll() is None:
            for child in descendants(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
            process.kill()
        process.wait(timeout=30)
