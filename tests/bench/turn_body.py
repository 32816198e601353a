"""A fleet turn WITHOUT Celery: what a turn's own work costs, for ``bench_fleet --body``.

Run:  python -m tests.bench.turn_body WARMUP NAME... (with a fleet environment; prints JSON)

Posts one item to each persona with a publisher that keeps the turn messages in memory instead
of sending them, then runs every turn in this process, one after another on one thread,
through the worker's own :class:`~workers.turn.TurnExecutor` (built as a worker builds it,
:func:`workers.runtime.build_executor`): ``start.lua``, soul composition, the loop, session
and transcript commits, ``finish.lua``. What is left out is exactly Celery's part (receive,
ack, the pool, task events). CPU per turn here is therefore a floor for ANY way of delivering
turns that keeps today's turn, several turns per broker message included: a bare Celery no-op
task's CPU divided by it bounds the drain-rate ratio issue 15's goal 1 asks for.

Prints one JSON object: ``{"turns": n, "cpu_ms": per turn after warm-up, "rate": turns/s,
"fsyncs": {"files": per turn, "directories": per turn}}``: every ``fsync``/``fdatasync`` the
timed turns made, counted by wrapping the two (a turn's durable commits, issue 15 goal 1).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from workers.fleet import Fleet
from workers.logs import configure_logging
from workers.runtime import build_executor
from workers.settings import Settings

__all__ = ["KeptMessages", "main"]


class KeptMessages:
    """A publisher that keeps what it is asked to send (the turns this process runs itself)."""

    def __init__(self) -> None:
        self.turns: list[tuple[str, str, str]] = []

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        self.turns.append((lane, turn_id, kind))

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        self.turns.extend(turns)


@contextmanager
def counting_fsyncs() -> Iterator[dict[str, int]]:
    """Count every ``os.fsync``/``os.fdatasync`` made inside, of files and of directories
    (the workers call them through the ``os`` module, so wrapping its attributes sees all)."""
    counts = {"files": 0, "directories": 0}
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync")}

    def counted(call: Callable[[Any], None]) -> Callable[[Any], None]:
        def wrapper(fd: Any) -> None:
            kind = "directories" if stat.S_ISDIR(os.fstat(fd).st_mode) else "files"
            counts[kind] += 1
            call(fd)

        return wrapper

    for name, call in real.items():
        setattr(os, name, counted(call))
    try:
        yield counts
    finally:
        for name, call in real.items():
            setattr(os, name, call)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    warmup, names = int(args[0]), args[1:]
    if not 0 <= warmup < len(names):
        print(f"turn_body: the warm-up ({warmup}) must be below the turns ({len(names)})",
              file=sys.stderr)  # fmt: skip
        return 2
    settings = Settings.from_env()
    configure_logging(settings.log_format, settings.log_level)
    kept = KeptMessages()
    fleet = Fleet(settings, publisher=kept)
    for name in names:
        fleet.post(name, "bench", sender="bench", channel="bench", wake=True)
    queued, kept.turns = kept.turns, []
    executor = build_executor(settings, fleet)
    try:
        began = cpu_began = 0.0
        with counting_fsyncs() as fsyncs:
            for n, (lane, turn_id, _kind) in enumerate(queued):
                if n == warmup:
                    began, cpu_began = time.perf_counter(), time.process_time()
                    fsyncs.update(files=0, directories=0)
                report = executor.execute(lane, turn_id)
                if report.outcome != "done":
                    print(f"turn_body: {lane} ended {report.outcome!r}", file=sys.stderr)
                    return 1
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    finally:
        executor.renewer.stop()
        fleet.client.close()
    timed = len(queued) - warmup
    per_turn = {kind: n / timed for kind, n in fsyncs.items()}
    print(json.dumps({"turns": timed, "cpu_ms": cpu * 1000 / timed, "rate": timed / wall,
                      "fsyncs": per_turn}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
