"""The usage ledger in a real Redis: a call is counted once, and a record Redis refuses
changes nothing, so the call's retry still counts it."""

from __future__ import annotations

from datetime import datetime

import pytest
import redis

from workers.fleet.keys import Keys
from workers.fleet.usage import UsageLedger
from workers.persona.clock import VirtualClock
from workers.persona.messages import Usage


def _record(ledger: UsageLedger, usage: Usage, call_id: str = "c1") -> int:
    return ledger.record(persona="ava", day="2026-12-01", call_id=call_id,
                         model="openai:m", kind="interactive", usage=usage)  # fmt: skip


def test_a_call_is_counted_once(redis_client: redis.Redis, key_prefix: str) -> None:
    """The same call id written twice (a retried write) adds its tokens once."""
    ledger = UsageLedger(redis_client, Keys(key_prefix), days=2)
    assert _record(ledger, Usage(100, 10)) == 110
    assert _record(ledger, Usage(100, 10)) == -1
    assert ledger.spent("ava", "2026-12-01") == 110


def test_a_refused_record_writes_nothing_and_its_retry_counts(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """A count Redis cannot add (beyond 1e12: the script checks before its first write) fails
    the record without setting the call's marker or any counter, so a retry of the same call
    with sane numbers is counted, not answered "already counted" with nothing recorded."""
    ledger = UsageLedger(redis_client, Keys(key_prefix), days=2)
    with pytest.raises(redis.ResponseError, match="is not a token count"):
        _record(ledger, Usage(10**17, 10))
    day = Keys(key_prefix).usage("2026-12-01", "ava")
    assert redis_client.hgetall(day) == {}
    assert _record(ledger, Usage(100, 10)) == 110
    assert ledger.spent("ava", "2026-12-01") == 110


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        # 00:30 in Berlin on the day after the spring change (that day had 23 hours)
        ("2026-03-29T22:30:00+00:00", ["2026-03-30", "2026-03-29", "2026-03-28"]),
        # 23:30 in Berlin on the autumn change day (25 hours)
        ("2026-10-25T22:30:00+00:00", ["2026-10-25", "2026-10-24", "2026-10-23"]),
    ],
)
def test_days_back_are_calendar_days_across_a_dst_change(
    redis_client: redis.Redis, key_prefix: str, now: str, expected: list[str]
) -> None:
    """``soulfleet usage NAME --days N`` reads the persona's last N days in its budget's time
    zone. They were found by stepping back 24 h at a time, which around a DST change skipped
    a day (its usage never shown) or named one day twice (its row listed, and added to the
    total, twice)."""
    clock = VirtualClock(datetime.fromisoformat(now).timestamp())
    ledger = UsageLedger(redis_client, Keys(key_prefix), days=8, clock=clock)
    assert ledger.days_back(3, "Europe/Berlin") == expected
    for day in expected:
        ledger.record(persona="ava", day=day, call_id=f"c-{day}", model="openai:m",
                      kind="interactive", usage=Usage(10, 1))  # fmt: skip
    rows = ledger.usage(["ava"], ledger.days_back(3, "Europe/Berlin"))
    assert [row.day for row in rows] == expected
    assert sum(row.tokens for row in rows) == 33
