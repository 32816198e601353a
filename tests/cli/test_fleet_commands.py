"""`run` and `dream --all` answered by a real `celery -A workers worker` process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.fleet import FleetProcess, fleet_env, start_worker, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def worker(
    redis_url: str, key_prefix: str, fleet_root: Path, tmp_path: Path
) -> Iterator[FleetProcess]:
    """One real worker serving this test's fleet (same Redis, prefix and personas)."""
    process = start_worker(
        fleet_env(redis_url=redis_url, key_prefix=key_prefix, personas=fleet_root),
        tmp_path / "logs",
        concurrency=4,
    )
    try:
        yield process
    finally:
        process.stop()


def test_run_through_the_fleet(invoke: Invoke, worker: FleetProcess, fleet_root: Path) -> None:
    """`run` posts the prompt, a worker's turn answers it, and the reply is printed as JSON."""
    result = invoke("run", "nora", "remember: the fleet answered", "--json", "--timeout", "60")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["status"] == "done"
    assert payload["text"].startswith("Noted.")
    assert payload["turn_id"]
    assert payload["usage"]["total_tokens"] > 0
    assert payload["usage"]["total_tokens"] == (
        payload["usage"]["input_tokens"] + payload["usage"]["output_tokens"]
    )
    assert payload["limit"] is None
    memory = (fleet_root / "nora" / "MEMORY.md").read_text(encoding="utf-8")
    assert "- the fleet answered" in memory
    # turn.end is logged just after the commit that answered us: poll for it.
    ended = wait_until(lambda: [e for e in worker.events("turn.end") if e["lane"] == "nora"],
                       timeout=30, what="nora's turn.end")  # fmt: skip
    assert [e["turn_id"] for e in ended] == [payload["turn_id"]]


def test_dream_all_waits_for_every_dreamer(
    invoke: Invoke, worker: FleetProcess, fleet_root: Path
) -> None:
    """`dream --all` wakes every dreamer, waits for the batch and reports them all done."""
    result = invoke("dream", "--all", "--timeout", "120")
    assert result.exit_code == 0, result.output
    assert "done: 3  skipped: 0  incomplete: 0  failed: 0  still running: 0" in result.stdout
    for name in ("ava", "milo", "nora"):
        log = fleet_root / name / "memory" / "log.md"
        assert "dream pass" in log.read_text(encoding="utf-8"), name

    def lanes() -> set[str]:
        return {e["lane"] for e in worker.events("turn.end")}

    wait_until(lambda: len(lanes()) >= 3, timeout=30, what="three dreamer turn.end events")
    assert lanes() == {"ava-dreamer", "milo-dreamer", "nora-dreamer"}
