"""Memory ``add`` against the fsync floor of the same disk, measured in ONE run; PRINTS figures.

Run:  .venv/bin/python -m tests.bench.bench_memory [local|shared]   (default: both lock modes)

The floor is what any durable atomic replace of a small file costs on this disk: write a temp
file, fsync it, rename it over the target, fsync the directory, with no lock and no read. It is
measured with 1 process, and with 4 processes each replacing its own file in one directory (the
journal then commits several writers' fsyncs together). For information, beside it, the append
floor: one line written at the end of a file and flushed with ``fdatasync``, what an ``add``
now does where it may (README "Safe writes"), 1 process and 4 each on its own file. Memory
``add`` is measured the same way:
1 process, and 4 processes adding to ONE MEMORY.md, in both lock modes; and, for information,
local adds with a write ledger (what a fleet turn pays: its work id keys each write), the
ledger filled first to the middle of its steady size (:data:`STEADY_ANSWERS` answers: a
persona that has run a while keeps 512 to 1,024, and each keyed write reads them; the 200 adds
measured leave it below the 1,024 that compacts it, where a steady ledger compacts about once
in 512 keyed writes). Within
each run, blocks of floor operations and of adds alternate (all processes pass a barrier
between blocks), so both see the same load on this shared machine; each ratio (goal >= 0.8,
issue 15) is the median over rounds. With strace installed it also prints the system calls one
add makes.
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
from multiprocessing.synchronize import Barrier
from pathlib import Path
from threading import BrokenBarrierError

import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.persona.filesystems import mounts
from workers.persona.ledger import WriteLedger, write_key
from workers.persona.locks import LockMode
from workers.persona.memory import memory_tool
from workers.persona.memory_paths import TargetCache
from workers.persona.memory_spec import MemoryRequest, parse_request

__all__ = ["GOAL", "STEADY_ANSWERS", "main", "syscalls_per_add"]

GOAL = 0.8
#: Answers in a ledger at the middle of its steady size (MAX_ENTRIES to 2 x MAX_ENTRIES).
STEADY_ANSWERS = 768
OPS = 200
BLOCK = 10
ROUNDS = 3
_PAYLOAD = b"- a small memory entry, about the size of one line in MEMORY.md\n" * 8


def _floor_op(directory: str, worker: int, index: int) -> None:
    target = os.path.join(directory, f"floor-{worker}.md")
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


def _append_op(directory: str, worker: int, index: int) -> None:
    target = os.path.join(directory, f"append-{worker}.md")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, _PAYLOAD[: len(_PAYLOAD) // 8])
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _serve(conn: Connection, worker: int, barriers: dict[int, Barrier]) -> None:
    """A long-lived worker process. For each command it alternates blocks of floor operations
    appends and memory adds; all workers of the command pass a barrier between blocks, so every
    block runs on its own, and worker 0 times the blocks: (floor, append, add seconds)."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,  # as workers/logs.py configures production
    )
    while True:
        command = conn.recv()
        if command is None:
            return
        processes, floor_dir, home, lock_mode, ledger = command
        barrier = barriers[processes]
        try:
            conn.send(_measure(worker, barrier, floor_dir=floor_dir, home=home,
                               lock_mode=lock_mode, ledger=ledger))  # fmt: skip
        except BrokenBarrierError:
            conn.send("")  # another worker failed and broke the barrier: it says why
        except Exception as exc:  # say what failed, and free the others from the barrier
            barrier.abort()
            conn.send(f"worker {worker}: {type(exc).__name__}: {exc}")


def _measure(
    worker: int, barrier: Barrier, *, floor_dir: str, home: str, lock_mode: LockMode, ledger: bool
) -> tuple[float, float, float]:
    scope = f"bench-turn-{worker}" if ledger else None
    tool = memory_tool(home, lock_mode=lock_mode, lock_timeout=120.0, write_scope=scope)
    spent = {"floor": 0.0, "append": 0.0, "add": 0.0}
    barrier.wait()
    for block in range(OPS // BLOCK):
        for kind in spent:
            began = time.perf_counter()
            for index in range(block * BLOCK, (block + 1) * BLOCK):
                if kind != "add":
                    (_floor_op if kind == "floor" else _append_op)(floor_dir, worker, index)
                    continue
                result = tool.execute({"action": "add", "text": f"worker {worker} #{index}"})
                if result.is_error:
                    raise RuntimeError(f"memory add failed: {result.output}")
            barrier.wait()
            spent[kind] += time.perf_counter() - began
    return spent["floor"], spent["append"], spent["add"]


def _steady_ledger(home: Path) -> None:
    """Give ``home``'s MEMORY.md the ledger a persona that has run a while has."""
    request = parse_request({"action": "add", "text": "x"}, notes=False, max_entry_bytes=64)
    assert isinstance(request, MemoryRequest)
    target = TargetCache().locate(home.resolve(), request, "local")
    assert target is not None
    os.makedirs(os.path.dirname(target.ledger), exist_ok=True)
    message = (  # what an add answers
        "Added an entry to MEMORY.md. It loads into your system prompt at the start of your "
        "next session."
    )
    WriteLedger(target.ledger).record_all(
        [
            (write_key("earlier-turn", str(index), ordinal=1), message)
            for index in range(STEADY_ANSWERS)
        ]
    )


class _Pool:
    def __init__(self, size: int) -> None:
        context = get_context("spawn")
        # Kept on self: a barrier the parent drops is gone before a child can unpickle it.
        self.barriers = barriers = {1: context.Barrier(1), size: context.Barrier(size)}
        self.conns: list[Connection] = []
        self.procs = []
        for worker in range(size):
            here, there = context.Pipe()
            proc = context.Process(target=_serve, args=(there, worker, barriers), daemon=True)
            proc.start()
            self.conns.append(here)
            self.procs.append(proc)

    def run(
        self, processes: int, root: Path, lock_mode: LockMode, ledger: bool
    ) -> tuple[float, float, float]:
        """(floor, append, add ops/s) of ``processes`` workers doing OPS of each, interleaved."""
        floor_dir, home = root / "floor", root / "home"
        floor_dir.mkdir()
        home.mkdir()
        if ledger:
            _steady_ledger(home)
        for conn in self.conns[:processes]:
            conn.send((processes, str(floor_dir), str(home), lock_mode, ledger))
        results = [conn.recv() for conn in self.conns[:processes]]
        failures = [result for result in results if isinstance(result, str) and result]
        if failures:  # a worker's error, instead of the wait it would have left this process in
            raise SystemExit("bench_memory: " + "; ".join(failures))
        floor_seconds, append_seconds, add_seconds = results[0]
        entries = (home / "MEMORY.md").read_bytes().count(b"\n")
        if entries != processes * OPS:
            raise SystemExit(f"lost writes: {entries} != {processes * OPS}")
        done = processes * OPS
        return done / floor_seconds, done / append_seconds, done / add_seconds

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
        cases.append(("local", 1, True))
    floors: dict[int, list[float]] = {1: [], 4: []}
    appends: dict[int, list[float]] = {1: [], 4: []}
    by_append: dict[_Case, list[float]] = {case: [] for case in cases}
    rates: dict[_Case, list[float]] = {case: [] for case in cases}
    ratios: dict[_Case, list[float]] = {case: [] for case in cases}
    pool = _Pool(4)
    measured_in = ""
    try:
        with tempfile.TemporaryDirectory(prefix="soulfleet-bench-memory-") as tmp:
            root = Path(tmp)
            measured_in = f"{tmp} ({_filesystem(tmp)})"
            time.sleep(2.0)  # let the spawned interpreters import before the first clock starts
            for round_ in range(ROUNDS):
                for number, case in enumerate(cases):
                    lock_mode, processes, ledger = case
                    where = root / f"run-{round_}-{number}"
                    where.mkdir()
                    floor, append, rate = pool.run(processes, where, lock_mode, ledger)
                    floors[processes].append(floor)
                    appends[processes].append(append)
                    by_append[case].append(rate / append)
                    rates[case].append(rate)
                    ratios[case].append(rate / floor)
            syscalls = {mode: syscalls_per_add(root, mode) for mode in modes}
    finally:
        pool.close()
    for processes, values in floors.items():
        print(
            f"fsync floor (write+fsync+rename+dir fsync), {processes} process(es): "
            f"median {statistics.median(values):,.0f} ops/s ({_spread(values)})"
        )
    for processes, values in appends.items():
        print(
            f"append floor (write at the end + fdatasync), {processes} process(es), for "
            f"information: median {statistics.median(values):,.0f} ops/s ({_spread(values)})"
        )
    for case in cases:
        lock_mode, processes, ledger = case
        ratio = statistics.median(ratios[case])
        if ledger:
            how = f"with a write ledger of {STEADY_ANSWERS} answers (fleet turns), for information"
        else:
            calls = syscalls[lock_mode]
            extra = "" if calls is None else f"; {calls:.0f} syscalls per add"
            how = f"goal >= {GOAL} ({'meets' if ratio >= GOAL else 'BELOW'}){extra}"
        print(
            f"memory add, {lock_mode} lock mode, {processes} process(es) x {OPS}: median "
            f"{statistics.median(rates[case]):,.0f} ops/s, {ratio:.2f}x the floor "
            f"({_spread(ratios[case], '.2f')}), {how}; "
            f"{statistics.median(by_append[case]):.2f}x the append floor"
        )
    print(
        f"{ROUNDS} rounds; in each, blocks of {BLOCK} floor operations, {BLOCK} appends and "
        f"{BLOCK} adds per process alternate; figures are medians over the rounds, (min-max) "
        f"beside them; load average {os.getloadavg()[0]:.1f}; measured in {measured_in}"
    )
    print(
        "The fsync floor is what issue 15's goal measures adds against: a durable atomic "
        "replace of a small file, what every add did before it appended in place. The append "
        "floor is the cheapest durable add possible (one write and one fdatasync, no lock, no "
        "read), for information."
    )


def _filesystem(path: str) -> str:
    """The filesystem type ``path`` is on (tmpfs flushes nothing: its figures mean little)."""
    device = os.stat(path).st_dev
    number = f"{os.major(device)}:{os.minor(device)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as table:
            found = mounts(table.read())
    except OSError:
        found = []
    return next((kind for mount, _, kind in found if mount == number), "filesystem unknown")


def _spread(values: list[float], spec: str = ",.0f") -> str:
    return f"{format(min(values), spec)}-{format(max(values), spec)}"


if __name__ == "__main__":
    main()
