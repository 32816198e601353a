"""workers/persona/spend.py: which model a turn pays for, budgets, the usage day, dream news."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from workers.persona.spend import (
    DailyBudget,
    budget_refuses,
    effective_budget,
    model_for_kind,
    newest_write,
    nothing_new,
    pass_times,
    usage_day,
)


@pytest.mark.parametrize(
    ("kind", "beat", "dream", "fleet_beat", "fleet_dream", "expected"),
    [
        ("interactive", "openai:b", "openai:d", "openai:fb", "openai:fd", "openai:p"),
        ("heartbeat", "openai:b", None, "openai:fb", "", "openai:b"),
        ("heartbeat", None, None, "openai:fb", "", "openai:fb"),
        ("heartbeat", None, None, "", "", "openai:p"),
        ("dream", None, "openai:d", "", "openai:fd", "openai:d"),
        ("dream", None, None, "", "openai:fd", "openai:fd"),
        ("dream", None, None, "openai:fb", "", "openai:p"),
    ],
)
def test_model_for_kind_precedence(
    *,
    kind: str,
    beat: str | None,
    dream: str | None,
    fleet_beat: str,
    fleet_dream: str,
    expected: str,
) -> None:
    """The persona's per-kind key, then the fleet's per-kind default, then the persona's model;
    a conversation always uses the persona's model."""
    assert (
        model_for_kind(
            kind,
            persona_model="openai:p",
            heartbeat_model=beat,
            dream_model=dream,
            fleet_heartbeat_model=fleet_beat,
            fleet_dream_model=fleet_dream,
        )
        == expected
    )


def test_budget_refusals_by_on_exceed_and_kind() -> None:
    """Under budget nothing is refused; at it, skip_background refuses heartbeats and dreams
    only, stop refuses everything; no limit refuses nothing."""
    background = DailyBudget(100)
    stop = DailyBudget(100, "stop")
    assert not budget_refuses(background, "heartbeat", 99)
    assert budget_refuses(background, "heartbeat", 100)
    assert budget_refuses(background, "dream", 150)
    assert not budget_refuses(background, "interactive", 150)
    assert budget_refuses(stop, "interactive", 100)
    assert not budget_refuses(DailyBudget(None), "heartbeat", 10**9)
    assert not budget_refuses(None, "heartbeat", 10**9)


def test_effective_budget_takes_the_fleet_default_for_missing_tokens() -> None:
    """SOULFLEET_DAILY_TOKENS fills a missing daily_tokens; the persona's own number wins."""
    assert effective_budget(None, 500) == DailyBudget(500)
    assert effective_budget(DailyBudget(None, "stop", "Asia/Tokyo"), 500) == DailyBudget(
        500, "stop", "Asia/Tokyo"
    )
    assert effective_budget(DailyBudget(7), 500) == DailyBudget(7)
    assert effective_budget(None, None) == DailyBudget(None)


def test_the_usage_day_is_the_budget_time_zone_s() -> None:
    """23:30 UTC is already the next day in Tokyo."""
    when = datetime(2026, 3, 10, 23, 30, tzinfo=UTC).timestamp()
    assert usage_day(when) == "2026-03-10"
    assert usage_day(when, "Asia/Tokyo") == "2026-03-11"


def test_dream_news_reads_conversations_and_notes(tmp_path: Path) -> None:
    """The newest write among the persona's session states (its committed conversation),
    memory notes, MEMORY.md and USER.md decides; its transcripts (silent beats are logged
    there), the dreamer's own session and other files do not count; a persona that never
    dreamed always has news."""
    for directory in ("sessions/ava", "sessions/ava-dreamer", "transcripts/ava", "memory"):
        (tmp_path / directory).mkdir(parents=True)
    files = {
        "sessions/ava/s1.f1.json": 100,
        "memory/people.md": 200,
        "MEMORY.md": 300,
        "transcripts/ava/s1.jsonl": 800,
        "sessions/ava-dreamer/d1.f1.json": 900,
        "SOUL.md": 950,
    }
    for name, when in files.items():
        path = tmp_path / name
        path.write_text("x")
        os.utime(path, (when, when))
    for directory in ("sessions/ava", "sessions/ava-dreamer", "sessions", "transcripts/ava",
                      "memory"):  # fmt: skip
        os.utime(tmp_path / directory, (50, 50))
    assert newest_write(tmp_path, "ava") == 300
    assert nothing_new(tmp_path, "ava", 300)
    assert not nothing_new(tmp_path, "ava", 299)
    assert not nothing_new(tmp_path, "ava", None)


def test_a_conversation_written_while_a_pass_ran_is_new_and_the_pass_own_notes_are_not(
    tmp_path: Path,
) -> None:
    """A pass that began at 100 and ended at 200: a conversation written at 150 came after the
    pass read the transcripts, so it is new (it was counted as folded, and skipped until
    something else was written); a note written at 150 is the pass's own, not new."""
    (tmp_path / "sessions" / "ava").mkdir(parents=True)
    (tmp_path / "memory").mkdir()
    note = tmp_path / "memory" / "people.md"
    note.write_text("- Tom likes tea\n")
    os.utime(note, (150, 150))
    for directory in ("sessions/ava", "memory"):
        os.utime(tmp_path / directory, (50, 50))
    assert nothing_new(tmp_path, "ava", 200, began=100)
    heard = tmp_path / "sessions" / "ava" / "s1.f2.json"
    heard.write_text("{}\n")
    os.utime(heard, (150, 150))
    os.utime(tmp_path / "sessions" / "ava", (50, 50))
    assert not nothing_new(tmp_path, "ava", 200, began=100)
    assert nothing_new(tmp_path, "ava", 200)  # without the start: the old reading, folded


@pytest.mark.parametrize(
    ("raw", "times"),
    [(None, None), ("", None), (b"", None), ("200000:100000", (200.0, 100.0)),
     (b"200000:100000", (200.0, 100.0)), ("200000", (200.0, 200.0))],
)  # fmt: skip
def test_pass_times_reads_ended_and_began_and_the_older_single_time(
    raw: object, times: tuple[float, float] | None
) -> None:
    """``"<ended ms>:<began ms>"``; a bare time (written before the start was kept) is a pass
    that began when it ended."""
    assert pass_times(raw) == times
