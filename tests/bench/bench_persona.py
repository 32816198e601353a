"""Benchmark the persona core's hot paths and PRINT the figures (no assertions: see tests/).

Run:  .venv/bin/python -m tests.bench.bench_persona   (or: python tests/bench/bench_persona.py)

* compose_soul with all seven bootstrap files at 2 MiB each (the worst case a turn can pay);
* memory ``add`` operations per second, 1 process and 4 contending processes on one MEMORY.md,
  for both lock modes. Every add is a full locked read-modify-write with fsyncs, so the figures
  depend on the disk; they are for comparing changes on one machine.
"""

from __future__ import annotations

import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.persona.home import BOOTSTRAP_ORDER, MAX_FILE_BYTES, compose_soul
from workers.persona.locks import LockMode
from workers.persona.memory import memory_tool

__all__ = ["bench_compose", "bench_memory", "main"]

ADDS_PER_PROCESS = 300


def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def bench_compose(root: Path, rounds: int = 20) -> tuple[float, float]:
    """(median, min) seconds for compose_soul over seven 2 MiB files (mixed ASCII and UTF-8)."""
    line = "- remembers that the café opens at 08:00 ☕\n".encode()
    body = (line * (MAX_FILE_BYTES // len(line) + 1))[:MAX_FILE_BYTES]
    for name in BOOTSTRAP_ORDER:
        (root / name).write_bytes(body)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        compose_soul(root, memory_index_cap=None)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def _adder(path: str, lock_mode: LockMode, worker: int, count: int, start: Event) -> None:
    _quiet()
    tool = memory_tool(path, lock_mode=lock_mode, lock_timeout=120.0)
    start.wait(60)
    for index in range(count):
        result = tool.execute({"action": "add", "text": f"worker {worker} entry {index}"})
        if result.is_error:
            raise SystemExit(result.output)


def bench_memory(root: Path, processes: int, lock_mode: LockMode) -> float:
    """Aggregate memory ``add`` operations per second with ``processes`` contending processes."""
    home = root / f"{lock_mode}-{processes}"
    home.mkdir()
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    workers = [
        context.Process(target=_adder, args=(str(home), lock_mode, n, ADDS_PER_PROCESS, start))
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(3.0)  # let the spawned interpreters finish importing before the clock starts
    began = time.perf_counter()
    start.set()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    if any(worker.exitcode for worker in workers):
        raise SystemExit(f"a worker failed ({lock_mode}, {processes} processes)")
    entries = (home / "MEMORY.md").read_text().count("\n")
    if entries != processes * ADDS_PER_PROCESS:
        raise SystemExit(f"lost entries: {entries} != {processes * ADDS_PER_PROCESS}")
    return entries / elapsed


def main() -> None:
    """Run every benchmark and print one line per figure."""
    _quiet()
    with tempfile.TemporaryDirectory(prefix="soulfleet-bench-") as tmp:
        root = Path(tmp)
        compose_home = root / "compose"
        compose_home.mkdir()
        median, best = bench_compose(compose_home)
        print(
            f"compose_soul, 7 files x 2 MiB: median {median * 1000:.1f} ms, "
            f"min {best * 1000:.1f} ms"
        )
        modes: tuple[LockMode, ...] = ("local", "shared")
        for lock_mode in modes:
            for processes in (1, 4):
                rate = bench_memory(root, processes, lock_mode)
                print(
                    f"memory add, {lock_mode} lock mode, {processes} process(es) x "
                    f"{ADDS_PER_PROCESS}: {rate:.0f} ops/s"
                )


if __name__ == "__main__":
    main()
