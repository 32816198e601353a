"""Benchmark the persona core's hot paths and PRINT the figures (no assertions: see tests/).

Run:  .venv/bin/python -m tests.bench.bench_persona   (or: python tests/bench/bench_persona.py)

* compose_soul with all seven bootstrap files at 2 MiB each (the worst case a turn can pay);
* compose_soul of a typical persona (seven 2 KiB files) beside the reference port's
  (``toolnexus`` 0.21.0) on the same directory, each timed the same way (timeit, many repeats,
  median) in a subprocess of its own, alternating: the goal is a ratio <= 1. toolnexus pins
  ``mcp<2`` and so cannot share our environment: it is installed on first use into a venv under
  ``$XDG_CACHE_HOME/soulfleet-bench`` (``~/.cache`` by default); if that fails the line says so;
* the per-turn lookups a fleet turn makes, each beside its anchor in the same run:
  ``from_dir`` of an unchanged persona (cached) vs the same call with the cache emptied (goal:
  well under 1), and ``confined`` vs a bare ``os.path.realpath`` of the same path (what every
  call cost before the root was cached: goal <= 1).

Memory ``add`` is measured by :mod:`tests.bench.bench_memory`, beside the fsync floor of the
same disk in the same run (issue 15).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.persona.agent import from_dir
from workers.persona.definitions import definitions
from workers.persona.files import confined
from workers.persona.home import BOOTSTRAP_ORDER, MAX_FILE_BYTES, compose_soul

__all__ = [
    "bench_compose",
    "bench_compose_vs_reference",
    "bench_lookups",
    "main",
]

REFERENCE = "toolnexus==0.21.0"
_REPO = Path(__file__).resolve().parents[2]
# Run in both interpreters: the same timing of ``compose_soul(dir)`` for ours and theirs.
_TIMER = """
import hashlib, json, statistics, sys, timeit
from {module} import compose_soul
directory, number, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soul, found = compose_soul(directory)
times = timeit.Timer(lambda: compose_soul(directory)).repeat(repeat=repeat, number=number)
print(json.dumps({{"median": statistics.median(times) / number, "found": found,
                  "sha": hashlib.sha256(soul.encode()).hexdigest()}}))
"""


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


def _reference_python() -> tuple[Path | None, str]:
    """The venv python that has the reference port, creating the venv on first use."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = cache / "soulfleet-bench" / REFERENCE.replace("==", "-")
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import toolnexus.agents.surface"]
    if python.exists() and subprocess.run(probe, check=False, capture_output=True).returncode == 0:
        return python, ""
    steps = (
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", REFERENCE],
        probe,
    )
    for step in steps:
        done = subprocess.run(step, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return None, f"{' '.join(step[:4])} failed: {lines[-1] if lines else done.returncode}"
    return python, ""


def _timed(python: str, module: str, directory: Path, number: int, repeat: int) -> dict[str, Any]:
    code = _TIMER.format(module=module)
    args = [python, "-c", code, str(directory), str(number), str(repeat)]
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=_REPO, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_compose_vs_reference(root: Path, rounds: int = 3) -> str:
    """One line: median ms per compose_soul of seven 2 KiB files, ours vs the reference's."""
    line = "- remembers that the café opens at 08:00 ☕\n".encode()
    body = (line * (2048 // len(line) + 1))[:2048].decode("utf-8", "ignore").encode()
    for name in BOOTSTRAP_ORDER:
        (root / name).write_bytes(body)
    python, problem = _reference_python()
    ours: list[float] = []
    theirs: list[float] = []
    same = True
    for _ in range(rounds):
        mine = _timed(sys.executable, "workers.persona.home", root, 2000, 25)
        ours.append(mine["median"])
        if python is not None:
            ref = _timed(str(python), "toolnexus.agents.surface", root, 2000, 25)
            theirs.append(ref["median"])
            same = same and (ref["sha"], ref["found"]) == (mine["sha"], mine["found"])
    head = f"compose_soul, 7 files x 2 KiB: ours median {statistics.median(ours) * 1000:.4f} ms"
    if python is None:
        return f"{head}; reference {REFERENCE} NOT INSTALLABLE, no ratio ({problem})"
    ratio = statistics.median(ours) / statistics.median(theirs)
    check = "identical souls" if same else "SOULS DIFFER"
    return (
        f"{head}, reference {REFERENCE} {statistics.median(theirs) * 1000:.4f} ms: "
        f"ratio {ratio:.2f} (goal <= 1; {rounds} alternating runs of 25 x 2000 calls, "
        f"{check})"
    )


def _median_us(call: Callable[[], object], number: int = 2000, repeat: int = 15) -> float:
    times = timeit.Timer(call).repeat(repeat=repeat, number=number)
    return statistics.median(times) / number * 1e6


def bench_lookups(root: Path) -> list[str]:
    """Lines for from_dir (cached vs parsed) and confined (vs realpath), same persona."""
    home = root / "personas" / "ava"
    home.mkdir(parents=True)
    (home / "persona.toml").write_text(
        'does = "answers"\nmodel = "scripted:rules.toml"\nmemory = true\n'
        '[heartbeat]\nevery = "30m"\n'
        'active_hours = { start = "08:00", end = "22:00", timezone = "Europe/Berlin" }\n'
        '[session]\nidle_reset = "4h"\nmax_tokens = 60000\n'
    )
    (home / "sessions" / "ava").mkdir(parents=True)

    def parsed() -> object:
        definitions.clear()
        return from_dir(home)

    cached = _median_us(lambda: from_dir(home))
    uncached = _median_us(parsed, number=500)
    relative = "sessions/ava/s1.f7.json"
    ours = _median_us(lambda: confined(home, relative))
    floor = _median_us(lambda: os.path.realpath(f"{home}/{relative}"))
    return [
        f"from_dir, unchanged persona.toml: cached {cached:.1f} us, parsed {uncached:.1f} us: "
        f"ratio {cached / uncached:.2f} (goal well under 1)",
        f"confined(home, {relative!r}): {ours:.1f} us, bare os.path.realpath of it "
        f"{floor:.1f} us: ratio {ours / floor:.2f} (goal <= 1)",
    ]


def main() -> None:
    """Run every benchmark and print one line per figure."""
    _quiet()
    with tempfile.TemporaryDirectory(prefix="soulfleet-bench-") as tmp:
        root = Path(tmp)
        compose_home = root / "compose"
        compose_home.mkdir()
        small_home = root / "compose-small"
        small_home.mkdir()
        print(bench_compose_vs_reference(small_home), flush=True)
        for line in bench_lookups(root):
            print(line, flush=True)
        median, best = bench_compose(compose_home)
        print(
            f"compose_soul, 7 files x 2 MiB: median {median * 1000:.1f} ms, "
            f"min {best * 1000:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
