"""The usage ledger in a real Redis: a call is counted once, and a record Redis refuses
changes nothing, so the call's retry still counts it."""

from __future__ import annotations

import pytest
import redis

from workers.fleet.keys import Keys
from workers.fleet.usage import UsageLedger
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
