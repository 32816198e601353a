"""Benchmark what a session sends a provider, and how much of it a prompt cache can reuse.

Run:  .venv/bin/python -m tests.bench.bench_session   (or: python tests/bench/bench_session.py)

A 30-turn conversation with the demo persona ``ava`` (its bootstrap files as shipped: a soul
of about 2 KB, plus the memory tool's schema) through ``workers.persona.runner(session=True)``
against the local
OpenAI-compatible and Anthropic test servers (tests/support/providers.py, real HTTP). For each
turn it prints the bytes of the request as the server received it and the share of that
request which is an unchanged prefix of the previous request: the part a provider's prompt
cache can serve (OpenAI caches exact prompt prefixes; Anthropic reads up to the previous
``cache_control`` breakpoint, which moves to the new end, so its byte prefix stops just
before that marker). Target: >= 90% from turn 3 on. Then the same conversation one-shot
(``session=False``), today's behaviour before sessions, for comparison.

No assertions: figures for comparing changes (tests/ pins the behaviour).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.providers import (
    FakeProvider,
    ProviderKind,
    Reply,
    anthropic_message,
    openai_completion,
)
from workers.local.demo import install_demo
from workers.persona.clock import VirtualClock
from workers.persona.runner import run

__all__ = ["common_prefix", "conversation", "main"]

TURNS = 30
TARGET = 0.90


def _quiet() -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,  # as workers/logs.py configures production
    )


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # binary search on slices: fast for long requests
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _answer(kind: str, turn: list[int]) -> Any:
    def respond(body: Any) -> Reply:
        turn[0] += 1
        text = (
            f"Answer {turn[0]}: here is what I would do, step by step, with the reasons "
            "and the one thing to double-check before you start."
        )
        if kind == "openai":
            return Reply(body=openai_completion(text, prompt_tokens=900, completion_tokens=60))
        return Reply(body=anthropic_message(text, input_tokens=900, output_tokens=60))

    return respond


def conversation(kind: ProviderKind, root: Path, *, session: bool) -> list[tuple[int, float]]:
    """(request bytes, unchanged-prefix share) for each of TURNS turns."""
    demo = root / f"demo-{kind}-{session}"
    install_demo(demo)
    home = demo / "ava"
    (home / "persona.toml").unlink()  # its model and schedules are not what is measured
    counter = [0]
    with FakeProvider(kind, respond=_answer(kind, counter)) as server:
        variable = "OPENAI_BASE_URL" if kind == "openai" else "ANTHROPIC_BASE_URL"
        os.environ[variable] = server.base_url
        os.environ.setdefault("ANTHROPIC_API_KEY", "bench-not-a-secret")
        clock = VirtualClock()
        for n in range(TURNS):
            prompt = f"Question {n + 1}: what should I do about the item on my list numbered {n}?"
            run(home, prompt, f"{kind}:bench", session=session, clock=clock)
            clock.advance(60)
        raws = [request.raw for request in server.requests]
    figures = []
    previous = b""
    for raw in raws:
        figures.append((len(raw), common_prefix(previous, raw) / len(raw)))
        previous = raw
    return figures


def main() -> None:
    """Print one line per turn, per provider dialect, with and without sessions."""
    _quiet()
    for variable in ("OPENAI_API_KEY", "SOULFLEET_MODEL"):
        os.environ.pop(variable, None)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kinds: tuple[ProviderKind, ...] = ("openai", "anthropic")
        for kind in kinds:
            figures = conversation(kind, root, session=True)
            print(f"\n{kind}: {TURNS}-turn session (bytes sent, unchanged prefix of previous)")
            for n, (size, share) in enumerate(figures, start=1):
                print(f"  turn {n:2d}: {size:7d} bytes  prefix {share:6.1%}")
            late = [share for _, share in figures[2:]]
            verdict = "meets" if min(late) >= TARGET else "MISSES"
            print(
                f"  from turn 3: min {min(late):.1%}, mean {sum(late) / len(late):.1%} "
                f"({verdict} the {TARGET:.0%} target); total {sum(s for s, _ in figures)} bytes"
            )
            one_shot = conversation(kind, root, session=False)
            shares = [share for _, share in one_shot[2:]]
            print(
                f"  one-shot (session=False) for comparison: "
                f"mean {sum(s for s, _ in one_shot) / len(one_shot):.0f} bytes/turn, "
                f"prefix from turn 3: mean {sum(shares) / len(shares):.1%}"
            )


if __name__ == "__main__":
    main()
