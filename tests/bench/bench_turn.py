"""Benchmark the per-turn overhead of the turn engine and PRINT it (no assertions: see tests/).

Run:  .venv/bin/python -m tests.bench.bench_turn [--turns N] [--action read|add]
      (or: python tests/bench/bench_turn.py)

One turn = what ``run``/the driver pay around the model: compose the soul from a persona with
all seven bootstrap files, build its tools, open a new transcript conversation, and run the loop
with the scripted model making exactly ONE tool call (``memory``; ``read`` by default, ``add``
to include a locked, fsynced write), then answering. Every transcript message is fsynced, so
the figures depend on the disk; they are for comparing changes on one machine.

Printed: turns per second and milliseconds per turn for the full turn, and for the bare loop
(soul and tools prepared once, no transcript) to show where the time goes.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.turns import make_persona
from workers.persona.agent import from_dir
from workers.persona.loop import Budget, RunResult, run_loop
from workers.persona.messages import Message
from workers.persona.models.scripted import ScriptedModel
from workers.persona.runner import run_agent
from workers.persona.transcripts import FileTranscripts, wait_pruned

__all__ = ["bench", "main"]


def _model(action: str) -> ScriptedModel:
    args = (
        {"action": "read", "target": "self"}
        if action == "read"
        else {"action": "add", "target": "note:bench", "text": "benchmark entry"}
    )
    return ScriptedModel.from_rules(
        {
            "rules": [
                {"when": {"tool_results": 0}, "calls": [{"tool": "memory", "args": args}]},
                {"text": "done"},
            ]
        }
    )


def bench(turn: Callable[[], RunResult], turns: int, warmup: int) -> tuple[float, float]:
    """(turns per second, median ms per turn) over ``turns`` timed turns after ``warmup``."""
    for _ in range(warmup):
        turn()
    durations = []
    began = time.perf_counter()
    for _ in range(turns):
        start = time.perf_counter()
        result = turn()
        durations.append(time.perf_counter() - start)
        if result.status != "done" or result.tool_calls != 1 or result.messages[2].is_error:
            raise SystemExit(f"unexpected turn: {result.status} {result.messages}")
    elapsed = time.perf_counter() - began
    return turns / elapsed, statistics.median(durations) * 1000


def fleet_transcript(
    home: Path, lane: str, turn_id: str, messages: int = 4, bound: int = 1000
) -> None:
    """What a fleet turn does with its transcript (workers/turn/): one writer scoped to the
    lane, messages written at once, one sync before the commit."""
    store = FileTranscripts(home, lanes=[lane], max_conversations=bound)
    writer = store.open(lane, turn_id, sync_each=False)
    try:
        for n in range(messages):
            writer.append(Message(role="user", content=f"message {n}"))
        writer.sync()
    finally:
        writer.close()


def bench_transcripts(home: Path, turns: int, stored: int = 1000) -> dict[str, float]:
    """A fleet turn's transcript work on a fresh lane and on a lane already holding ``stored``
    conversations (the default bound, so every new one also prunes one).

    Wall time: turns taken alternately, so both see the same machine; median and mean ms. CPU:
    process time (every thread: the background pruner's unlinks included, waited for inside the
    measurement) over alternating blocks of 25 turns, in ms per turn. A third lane holds as
    many files under a bound it never reaches ("big"): the same directory size without the
    pruning, which splits what a full lane costs into listing/index work and the filesystem's
    work of deleting a file per turn."""
    fresh: list[float] = []
    full: list[float] = []
    big: list[float] = []
    for i in range(stored):
        fleet_transcript(home, "full", f"old{i:05d}", messages=1)
        fleet_transcript(home, "big", f"big{i:05d}", messages=1, bound=10**9)
    wait_pruned()
    for i in range(turns):
        for lane, into in ((f"fresh{i:05d}", fresh), ("full", full), ("big", big)):
            start = time.perf_counter()
            fleet_transcript(home, lane, f"t{lane}{i:05d}", bound=10**9 if lane == "big" else 1000)
            into.append(time.perf_counter() - start)
    wait_pruned()
    cpu = {"fresh": 0.0, "full": 0.0}
    for block in range(0, turns, 25):
        for kind in ("fresh", "full"):
            began = time.process_time()
            for i in range(block, min(block + 25, turns)):
                lane = f"cpu{i:05d}" if kind == "fresh" else "full"
                fleet_transcript(home, lane, f"c{lane}{i:05d}")
            wait_pruned()
            cpu[kind] += time.process_time() - began
    return {
        "fresh_median": statistics.median(fresh) * 1000,
        "full_median": statistics.median(full) * 1000,
        "fresh_mean": statistics.mean(fresh) * 1000,
        "full_mean": statistics.mean(full) * 1000,
        "big_median": statistics.median(big) * 1000,
        "fresh_cpu": cpu["fresh"] * 1000 / turns,
        "full_cpu": cpu["full"] * 1000 / turns,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--action", choices=("read", "add"), default="read")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    model = _model(args.action)
    budget = Budget()
    with tempfile.TemporaryDirectory() as tmp:
        agent = from_dir(make_persona(Path(tmp), manifest="notes = true\n"))
        full = bench(
            lambda: run_agent(agent, "hello", model=model, budget=budget), args.turns, args.warmup
        )
        soul, _ = agent.soul()
        tools = agent.toolset()
        bare = bench(
            lambda: run_loop(system=soul, prompt="hello", tools=tools, model=model, budget=budget),
            args.turns,
            args.warmup,
        )
        (Path(tmp) / "ts").mkdir()
        ts = bench_transcripts(Path(tmp) / "ts", args.turns)
    print(
        f"turn benchmark: scripted model, 7 bootstrap files, 1 memory {args.action} per turn, "
        f"{args.turns} turns"
    )
    print(
        f"  full turn (soul + tools + transcript + loop): {full[0]:8.1f} turns/s  "
        f"{full[1]:7.3f} ms/turn (median)"
    )
    print(
        f"  bare loop (no soul, no transcript):           {bare[0]:8.1f} turns/s  "
        f"{bare[1]:7.3f} ms/turn (median)"
    )
    print(
        "  fleet transcript of a turn (4 messages, one sync), lane's first turn vs with 1,000 "
        "stored (goal: ratio ~1):"
    )
    for what, unit in (("median", "wall"), ("mean", "wall"), ("cpu", "CPU")):
        first, thousandth = ts[f"fresh_{what}"], ts[f"full_{what}"]
        label = f"{unit} {what}" if unit == "wall" else "CPU per turn"
        print(
            f"    {label:<13} first {first:7.3f} ms, 1,000 stored {thousandth:7.3f} ms: "
            f"ratio {thousandth / first:.2f}"
        )
    print(
        f"    (1,000 stored under a bound not reached, no pruning: wall median "
        f"{ts['big_median']:.3f} ms, ratio {ts['big_median'] / ts['fresh_median']:.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
