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
from workers.persona.run import run_agent
from workers.persona.transcripts import FileTranscripts

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


def fleet_transcript(home: Path, lane: str, turn_id: str, messages: int = 4) -> None:
    """What a fleet turn does with its transcript (workers/turn/): one writer scoped to the
    lane, messages written at once, one sync before the commit."""
    writer = FileTranscripts(home, lanes=[lane]).open(lane, turn_id, sync_each=False)
    try:
        for n in range(messages):
            writer.append(Message(role="user", content=f"message {n}"))
        writer.sync()
    finally:
        writer.close()


def bench_transcripts(home: Path, turns: int, stored: int = 1000) -> tuple[float, float]:
    """Median ms of a fleet turn's transcript work on a fresh lane and on a lane already
    holding ``stored`` conversations (the default bound, so every new one also prunes one),
    taken alternately so both see the same machine."""
    fresh: list[float] = []
    full: list[float] = []
    for i in range(stored):
        fleet_transcript(home, "full", f"old{i:05d}", messages=1)
    for i in range(turns):
        for lane, into in ((f"fresh{i:05d}", fresh), ("full", full)):
            start = time.perf_counter()
            fleet_transcript(home, lane, f"t{lane}{i:05d}")
            into.append(time.perf_counter() - start)
    return statistics.median(fresh) * 1000, statistics.median(full) * 1000


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
        first, thousandth = bench_transcripts(Path(tmp) / "ts", args.turns)
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
        f"  fleet transcript of a turn (4 messages, one sync): lane's first turn {first:.3f} ms, "
        f"with 1,000 stored {thousandth:.3f} ms: ratio {thousandth / first:.2f} (goal ~1)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
