"""`soulfleet usage [NAME] [--top N] [--days N] [--json]`: tokens per persona per day."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from tests.cli.conftest import Invoke
from tests.support.cli import PASSWORD, settings_for
from workers.fleet.keys import Keys
from workers.fleet.usage import UsageLedger
from workers.persona.messages import Usage
from workers.persona.spend import usage_day


def _ledger(env: Mapping[str, str | None]) -> UsageLedger:
    settings = settings_for(env)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    return UsageLedger(client, Keys(settings.key_prefix), days=settings.usage_days)


def _spend(ledger: UsageLedger, persona: str, model: str, tokens: int, day: str) -> None:
    ledger.record(
        persona=persona,
        day=day,
        call_id=f"{persona}:{model}:{tokens}:{day}",
        model=model,
        kind="heartbeat",
        usage=Usage(tokens, 1, cached_input_tokens=tokens // 2),
    )


def test_usage_lists_spenders_biggest_first_and_top_keeps_the_first_n(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """Without NAME: every persona that used a model today, most tokens first; --top 1 keeps
    only the biggest; --json carries the same numbers."""
    ledger = _ledger(env)
    today = usage_day(time.time())
    _spend(ledger, "milo", "openai:small", 50, today)
    _spend(ledger, "ava", "openai:small", 500, today)
    result = invoke("usage")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["DAY", "PERSONA", "TOKENS"]
    assert [line.split()[1] for line in lines[1:3]] == ["ava", "milo"]
    assert lines[-1] == "total: 552 tokens in 2 model calls"
    top = json.loads(invoke("usage", "--top", "1", "--json").stdout)["usage"]
    assert [(row["persona"], row["tokens"], row["cached"]) for row in top] == [("ava", 501, 250)]


def test_usage_for_one_persona_shows_each_model_and_past_days(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """With NAME and --days 2: one row per day, and per model when it used several."""
    ledger = _ledger(env)
    now = time.time()
    today, yesterday = usage_day(now), usage_day(now - 86400)
    _spend(ledger, "ava", "openai:small", 10, today)
    _spend(ledger, "ava", "openai:big", 100, today)
    _spend(ledger, "ava", "openai:big", 7, yesterday)
    payload = json.loads(invoke("usage", "ava", "--days", "2", "--json").stdout)["usage"]
    assert [(row["day"], row["tokens"]) for row in payload] == [(today, 112), (yesterday, 8)]
    assert payload[0]["models"]["openai:big"]["tokens"] == 101
    text = invoke("usage", "ava").stdout
    assert "openai:small" in text
    assert "openai:big" in text


def test_usage_of_a_removed_persona_still_shows_its_recorded_spend(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """`usage` listed a removed persona's spend, but `usage NAME` refused it (unknown persona,
    exit 2): its recorded spend is shown, with a note that it has no directory; a name with
    nothing recorded is still unknown."""
    ledger = _ledger(env)
    _spend(ledger, "ava", "openai:big", 100, usage_day(time.time()))
    shutil.rmtree(fleet_root / "ava")
    result = invoke("usage", "ava")
    assert result.exit_code == 0, result.output
    assert "openai:big" in result.stdout
    assert "has no directory under" in result.stderr
    assert invoke("usage", "nobody").exit_code == 2


def test_usage_with_nothing_counted_says_so(invoke: Invoke) -> None:
    """No calls counted: one plain line, exit 0."""
    result = invoke("usage")
    assert result.exit_code == 0
    assert result.stdout.strip() == "no model calls counted in that time"


def test_usage_redis_unreachable(invoke: Invoke, dead_redis_env: Mapping[str, str | None]) -> None:
    """A dead Redis: exit 1, one line naming it without its password."""
    result = invoke("usage", environ=dead_redis_env)
    assert result.exit_code == 1
    assert PASSWORD not in result.output
    assert result.stderr.startswith("soulfleet: error: Redis at redis://:***@127.0.0.1:")


def test_status_shows_today_s_tokens(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """`status NAME --json` carries today's tokens (and the budget: none here); the table shows
    them in the TOKENS TODAY column."""
    _spend(_ledger(env), "ava", "openai:small", 40, usage_day(time.time()))
    payload = json.loads(invoke("status", "ava", "--json").stdout)
    assert (payload["tokens_today"], payload["daily_tokens"]) == (41, None)
    assert "models" in payload
    header, row = invoke("status").stdout.splitlines()[:2]
    column = header.index("TOKENS TODAY")
    assert row[column:].split()[0] == "41"
