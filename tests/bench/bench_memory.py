"""Memory ``add`` against the fsync floor of the same disk, measured in ONE run; PRINTS figures.

Run:  .venv/bin/python -m tests.bench.bench_memory [local|shared]   (default: both lock modes)

The floor is what any durable atomic replace of a small file costs on this disk: write a temp
file, fsync it, rename it over the target, fsync the directory, with no lock and no read. It is
measured with 1 process, and with 4 processes each replacing its own file in one directory (the
journal then commits several writers' fsyncs together). Memory ``add`` is measured the same way:
1 process, and 4 processes adding to ONE MEMORY.md, in both lock modes; and, for information,
local adds with a write ledger (what a fleet turn pays: its work id keys each write). Rounds
alternate floor and add, so both see the same load; the ratio (goal >= 0.8, issue 15) is the
median over rounds. With strace installed it also prints the system calls one add makes.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from multiprocessing.connection import Connection
from pathlib import Path

import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.persona.locks import LockMode
from workers.persona.memory import memory_tool

__all__ = ["GOAL", "main", "syscalls_per_add"]

GOAL = 0.8
OPS = 400
ROUNDS = 3
_PAYLOAD = b"- a small memory entry, about the size of one line in MEMORY.md\n" * 8
_Span = tuple[float, float]


def _floor(directory: str, worker: int, count: int) -> None:
    target = os.path.join(directory, f"floor-{worker}.md")
    for index in range(count):
        temp = f"{target}.{index}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, _PAYLOAD)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _adds(directory: str, worker: int, count: int, lock_mode: LockMode, ledger: bool) -> None:
    scope = f"bench-turn-{worker}" if ledger else None
    tool = memory_tool(directory, lock_mode=lock_mode, lock_timeout=120.0, write_scope=scope)
    for index in range(count):
        result = tool.execute({"action": "add", "text": f"worker {worker} entry {index}"})
        if result.is_error:
            raise RuntimeError(result.output)


def _serve(conn: Connection, worker: int) -> None:
    """A long-lived worker process: runs each command it is sent, from a shared start time."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    while True:
        command = conn.recv()
        if command is None:
            return
        kind, directory, count, lock_mode, ledger, start_at = command
        time.sleep(max(0.0, start_at - time.time()))
        began = time.time()
        if kind == "floor":
            _floor(directory, worker, count)
        else:
            _adds(directory, worker, count, lock_mode, ledger)
        conn.send((began, time.time()))


class _Pool:
    def __init__(self, size: int) -> None:
        context = get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for worker in range(size):
            here, there = context.Pipe()
            proc = context.Process(target=_serve, args=(there, worker), daemon=True)
            proc.start()
            self.conns.append(here)
            self.procs.append(proc)

    def run(
        self, processes: int, kind: str, directory: Path, lock_mode: str = "", ledger: bool = False
    ) -> float:
        """Aggregate ops/s of ``processes`` workers doing OPS each, all starting together."""
        start_at = time.time() + 0.3
        for conn in self.conns[:processes]:
            conn.send((kind, str(directory), OPS, lock_mode, ledger, start_at))
        spans: list[_Span] = [conn.recv() for conn in self.conns[:processes]]
        return processes * OPS / (max(end for _, end in spans) - min(b for b, _ in spans))

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(10)


def syscalls_per_add(root: Path, lock_mode: LockMode, adds: int = 50) -> float | None:
    """System calls per add (strace -f, between two markers), or None without strace."""
    if shutil.which("strace") is None:
        return None
    home = root / f"strace-{lock_mode}"
    home.mkdir()
    log = root / f"strace-{lock_mode}.log"
    script = (
        "import logging, os, structlog\n"
        "structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))\n"
        "from workers.persona.memory import memory_tool\n"
        f"tool = memory_tool({str(home)!r}, lock_mode={lock_mode!r})\n"
        "tool.execute({'action': 'add', 'text': 'warm up'})\n"
        "os.write(2, b'BENCH-MARK\\n')\n"
        f"for i in range({adds}):\n"
        "    tool.execute({'action': 'add', 'text': f'entry {i}'})\n"
        "os.write(2, b'BENCH-MARK\\n')\n"
    )
    repo = str(Path(__file__).resolve().parents[2])
    subprocess.run(
        ["strace", "-f", "-o", str(log), sys.executable, "-c", script],
        check=True,
        cwd=repo,
        capture_output=True,
    )
    lines = log.read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if "BENCH-MARK" in line]
    inside = lines[marks[0] + 1 : marks[1]]
    calls = [line for line in inside if "resumed>" not in line and "+++" not in line]
    return len(calls) / adds


_Case = tuple[LockMode, int, bool]


def main() -> None:
    """Print the floor and memory add per mode and process count, with each ratio and the goal."""
    modes: tuple[LockMode, ...] = ("local", "shared")
    if sys.argv[1:] in (["local"], ["shared"]):
        modes = ("local",) if sys.argv[1] == "local" else ("shared",)
    cases: list[_Case] = [(m, n, False) for m in modes for n in (1, 4)]
    if "local" in modes:
        cases += [("local", 1, True), ("local", 4, True)]
    floors: dict[int, list[float]] = {1: [], 4: []}
    rates: dict[_Case, list[float]] = {case: [] for case in cases}
    ratios: dict[_Case, list[float]] = {case: [] for case in cases}
    pool = _Pool(4)
    try:
        with tempfile.TemporaryDirectory(prefix="soulfleet-bench-memory-") as tmp:
            root = Path(tmp)
            time.sleep(2.0)  # let the spawned interpreters import before the first clock starts
            for round_ in range(ROUNDS):
                for number, (lock_mode, processes, ledger) in enumerate(cases):
                    floor_dir = root / f"floor-{round_}-{number}"
                    home = root / f"home-{round_}-{number}"
                    floor_dir.mkdir()
                    home.mkdir()
                    floor = pool.run(processes, "floor", floor_dir)
                    rate = pool.run(processes, "add", home, lock_mode, ledger)
                    entries = (home / "MEMORY.md").read_bytes().count(b"\n")
                    if entries != processes * OPS:
                        raise SystemExit(f"lost writes: {entries} != {processes * OPS}")
                    floors[processes].append(floor)
                    rates[(lock_mode, processes, ledger)].append(rate)
                    ratios[(lock_mode, processes, ledger)].append(rate / floor)
            syscalls = {mode: syscalls_per_add(root, mode) for mode in modes}
    finally:
        pool.close()
    for processes, values in floors.items():
        print(
            f"fsync floor (write+fsync+rename+dir fsync), {processes} process(es): "
            f"median {statistics.median(values):,.0f} ops/s ({_spread(values)})"
        )
    for case in cases:
        lock_mode, processes, ledger = case
        ratio = statistics.median(ratios[case])
        if ledger:
            how = "with a write ledger (fleet turns), for information"
        else:
            calls = syscalls[lock_mode]
            extra = "" if calls is None else f"; {calls:.0f} syscalls per add"
            how = f"goal >= {GOAL} ({'meets' if ratio >= GOAL else 'BELOW'}){extra}"
        print(
            f"memory add, {lock_mode} lock mode, {processes} process(es) x {OPS}: median "
            f"{statistics.median(rates[case]):,.0f} ops/s, {ratio:.2f}x the floor "
            f"({_spread(ratios[case], '.2f')}), {how}"
        )
    print(f"{ROUNDS} rounds, floor and add alternating; load average {os.getloadavg()[0]:.1f}")


def _spread(values: list[float], spec: str = ",.0f") -> str:
    return f"{format(min(values), spec)}-{format(max(values), spec)}"


if __name__ == "__main__":
    main()
