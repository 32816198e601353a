"""`soulfleet dream PERSONA | --all`: wake dreamers now; watch a batch to its summary."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import (
    PASSWORD,
    commit_turn,
    dead_letter,
    lanes_for,
    spend_today,
    with_budget,
)
from workers.cli.dream import watch_batch
from workers.persona.spend import pass_field


def test_dream_persona_queues_a_pass_on_the_dreamer_lane(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """`dream nora` queues a dream turn on nora-dreamer, not on nora's own lane."""
    result = invoke("dream", "nora")
    assert result.exit_code == 0, result.output
    lanes = lanes_for(env)
    dreamer = lanes.status("nora-dreamer")
    assert dreamer["state"] == "queued"
    assert dreamer["kind"] == "dream"
    assert f"turn {dreamer['turn_id']}" in result.stdout
    assert lanes.status("nora")["state"] == "idle"


def test_dream_twice_coalesces(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """A second `dream` while one is queued joins it instead of queueing another."""
    assert invoke("dream", "ava").exit_code == 0
    result = invoke("dream", "ava")
    assert result.exit_code == 0
    assert "already queued or running" in result.stdout
    assert lanes_for(env).status("ava-dreamer")["pending_ticks"] == 2


def test_dream_dead_lettered_dreamer_exit_1(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """A dead-lettered dreamer lane is a runtime failure pointing at `soulfleet status`."""
    dead_letter(lanes_for(env), "milo-dreamer")
    result = invoke("dream", "milo")
    assert result.exit_code == 1
    assert "dead-lettered" in result.stderr
    assert "soulfleet status milo" in result.stderr


def test_dream_all_times_out_with_a_summary(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """With no worker running, --all reports every dreamer still queued (exit 1: it called
    them "still running", which no worker was doing) and counts a dead-lettered one as
    failed."""
    dead_letter(lanes_for(env), "milo-dreamer")
    result = invoke("dream", "--all", "--timeout", "0")
    assert result.exit_code == 1
    assert (
        "done: 0  skipped: 0  incomplete: 0  failed: 1  still running: 0  retrying: 0  "
        "still queued: 2" in result.stdout
    )
    assert "failed: milo-dreamer" in result.stdout
    assert "still queued (no worker has taken them yet): ava-dreamer, nora-dreamer" in (
        result.stdout
    )
    assert lanes_for(env).status("ava-dreamer")["state"] == "queued"
    assert "waiting up to 0s (--timeout) for their passes" in result.stderr
    # Not a terminal: no progress bar, whose bare label was left as a stray "dreaming" line.
    assert [line for line in result.stderr.splitlines() if line.strip() == "dreaming"] == []


def test_dream_all_reports_a_pass_waiting_out_its_retry_as_retrying_with_its_error(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A dreamer whose pass failed and waits out its backoff was listed "still running" (an
    operator waited for a pass no worker was doing): it is "retrying", with its error."""
    lanes = lanes_for(env)
    outcome = lanes.tick("nora-dreamer", kind="dream")
    assert outcome.turn_id is not None
    started = lanes.start("nora-dreamer", outcome.turn_id, "test-worker")
    lanes.fail("nora-dreamer", started.fence, error="HTTP 500 from the provider",
               backoff=(300.0, 600.0), jitter=1.0)  # fmt: skip
    assert lanes.status("nora-dreamer")["state"] == "retry"
    result = invoke("dream", "--all", "--timeout", "0", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["retrying"] == ["nora-dreamer"]
    assert "nora-dreamer" not in report["still_running"]
    text = invoke("dream", "--all", "--timeout", "0").stdout
    assert "retrying: 1" in text
    assert "nora-dreamer: HTTP 500 from the provider" in text


def test_dream_of_a_persona_with_nothing_new_says_the_pass_will_be_skipped(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """`dream ava` said "dream pass queued" and the worker then skipped it (nothing_new)
    without a word here: it warns when nothing was written since the last pass, and not
    when something was."""
    lanes = lanes_for(env)
    later = time.time() + 60  # a pass that ended after every file of the persona was written
    lanes.client.hset(lanes.keys.lane("ava-dreamer"), "last_pass", pass_field(later, later))
    result = invoke("dream", "ava")
    assert result.exit_code == 0, result.output
    assert "dream pass queued for ava" in result.stdout
    assert "nothing was written for ava since its last dream pass" in result.stderr
    assert "reason nothing_new" in result.stderr
    lanes.client.hset(lanes.keys.lane("nora-dreamer"), "last_pass", pass_field(1.0, 1.0))
    fresh = invoke("dream", "nora")
    assert fresh.exit_code == 0, fresh.output
    assert "nothing was written" not in fresh.stderr
    # A field written by hand that does not parse: the pass is queued all the same, no hint.
    lanes.client.hset(lanes.keys.lane("milo-dreamer"), "last_pass", "yesterday")
    odd = invoke("dream", "milo")
    assert odd.exit_code == 0, odd.output
    assert "dream pass queued for milo" in odd.stdout


@pytest.mark.parametrize("args", [(), ("ava", "--all")])
def test_dream_needs_exactly_one_of_persona_or_all(invoke: Invoke, args: tuple[str, ...]) -> None:
    """Neither or both of PERSONA and --all is a usage error (exit 2)."""
    result = invoke("dream", *args)
    assert result.exit_code == 2
    assert "either PERSONA or --all" in result.stderr


def test_dream_unknown_persona_exit_2(invoke: Invoke) -> None:
    """An unknown persona: exit 2, one line."""
    result = invoke("dream", "nobody")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1


def test_a_typo_of_a_persona_name_is_answered_with_the_name_meant(invoke: Invoke) -> None:
    """`noar` for `nora`: the one line names the persona it surely meant; a name like none
    suggests nothing."""
    result = invoke("dream", "noar")
    assert result.exit_code == 2
    assert "unknown persona 'noar'" in result.stderr
    assert "(did you mean 'nora'?)" in result.stderr
    assert "did you mean" not in invoke("dream", "zzzzzz").stderr


def test_dream_redis_unreachable(invoke: Invoke, dead_redis_env: Mapping[str, str | None]) -> None:
    """Redis down: exit 1, the URL without its password, `soulfleet up` suggested."""
    result = invoke("dream", "ava", environ=dead_redis_env)
    assert result.exit_code == 1
    assert PASSWORD not in result.output
    assert "soulfleet up" in result.stderr


def test_dream_all_skips_a_persona_whose_files_are_invalid(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """--all runs the same check-up as `dream PERSONA`: an invalid persona is named with its
    reason, counted, not ticked (its dreamer would only be dead-lettered), and exit is 1."""
    (fleet_root / "milo" / "persona.toml").write_text("[heartbeat\n")
    result = invoke("dream", "--all", "--timeout", "0", "--json")
    assert result.exit_code == 1
    outcome = json.loads(result.stdout)
    assert set(outcome["invalid"]) == {"milo"}
    assert "persona.toml" in outcome["invalid"]["milo"]
    assert outcome["still_queued"] == ["ava-dreamer", "nora-dreamer"]
    assert outcome["still_running"] == []
    assert "skipped milo" in result.stderr
    assert lanes_for(env).status("milo-dreamer").get("state") in (None, "idle")


def test_dream_all_counts_a_pass_that_ended_without_a_model_call_as_skipped(
    invoke: Invoke, env: Mapping[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that ended 'skipped' (budget used up, nothing new) did not dream: --all lists it
    as skipped, not done (it reported every budget-skipped dreamer as done), by the status the
    watch saw its pass end with."""
    # The watch itself (polling the lanes until their passes end) is the integration tests'.
    monkeypatch.setattr(
        sys.modules["workers.cli.dream"],
        "watch_batch",
        lambda fleet, before, timeout: ({"ava-dreamer": "done", "nora-dreamer": "skipped"}, [], []),
    )
    result = invoke("dream", "--all", "--json")
    outcome_json = json.loads(result.stdout)
    assert outcome_json["done"] == ["ava-dreamer"]
    assert outcome_json["skipped"] == ["nora-dreamer"]


def test_dream_all_counts_a_pass_that_ended_at_a_limit_as_incomplete_and_fails(
    invoke: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that ended 'incomplete' (its input over the turn budget: no model call; its time
    or calls used up) was listed as done, exit 0, though the README says exit 1 unless every
    pass succeeded: it is listed apart, and the command exits 1."""
    monkeypatch.setattr(
        sys.modules["workers.cli.dream"],
        "watch_batch",
        lambda fleet, before, timeout: (
            {"ava-dreamer": "done", "nora-dreamer": "incomplete", "milo-dreamer": "done"},
            [],
            [],
        ),
    )
    result = invoke("dream", "--all", "--json")
    assert result.exit_code == 1, result.output
    outcome_json = json.loads(result.stdout)
    assert outcome_json["done"] == ["ava-dreamer", "milo-dreamer"]
    assert outcome_json["incomplete"] == ["nora-dreamer"]
    plain = invoke("dream", "--all")
    assert "incomplete: 1" in plain.stdout
    assert "incomplete (ended at a limit" in plain.stdout


def test_watch_batch_counts_a_pass_that_dead_lettered_its_dreamer_as_failed(
    env: Mapping[str, str | None],
) -> None:
    """The failure that dead-letters a dreamer also moves its last_turn: the watch counted
    that pass as done. A pass that failed and waits for its retry is still running; one that
    committed is done."""
    lanes = lanes_for(env)
    watched = ["ava-dreamer", "milo-dreamer", "nora-dreamer"]
    before = {lane: lanes.status(lane).get("last_turn") for lane in watched}
    commit_turn(lanes, "ava-dreamer", "dreamt", kind="dream")
    dead_letter(lanes, "milo-dreamer", error="ModelAuthError: no key")
    outcome = lanes.tick("nora-dreamer", kind="dream")
    assert outcome.turn_id is not None
    started = lanes.start("nora-dreamer", outcome.turn_id, "test-worker")
    lanes.fail("nora-dreamer", started.fence, error="timeout", backoff=(30.0, 60.0), jitter=1.0)
    assert lanes.status("nora-dreamer")["state"] == "retry"
    fleet = SimpleNamespace(lanes=lanes)
    ended, failed, running = watch_batch(fleet, before, timeout=0.0, poll=0.01)  # type: ignore[arg-type]
    assert (ended, failed, running) == ({"ava-dreamer": "done"}, ["milo-dreamer"], ["nora-dreamer"])


def test_watch_batch_keeps_the_status_a_pass_ended_with(env: Mapping[str, str | None]) -> None:
    """The batch's pass ends skipped; a later pass of the same dreamer (its schedule) commits
    while the watch still waits for another lane: the lane stays skipped (it read each lane's
    status again at the end, and called it done)."""
    lanes = lanes_for(env)
    watched = ["ava-dreamer", "nora-dreamer"]
    before = {lane: lanes.status(lane).get("last_turn") for lane in watched}
    outcome = lanes.tick("ava-dreamer", kind="dream")
    assert outcome.turn_id is not None
    started = lanes.start("ava-dreamer", outcome.turn_id, "test-worker")
    lanes.finish("ava-dreamer", started.fence, status="skipped", text="")
    polls = 0
    real_status = lanes.status

    def status(lane: str) -> dict[str, Any]:
        nonlocal polls
        polls += 1
        if polls == 3:  # after the first round: the scheduled pass commits
            commit_turn(lanes, "ava-dreamer", "dreamt", kind="dream")
        if polls == 5:
            commit_turn(lanes, "nora-dreamer", "dreamt", kind="dream")
        return real_status(lane)

    fleet = SimpleNamespace(lanes=SimpleNamespace(status=status))
    ended, failed, running = watch_batch(fleet, before, timeout=5.0, poll=0.01)  # type: ignore[arg-type]
    assert ended == {"ava-dreamer": "skipped", "nora-dreamer": "done"}
    assert (failed, running) == ([], [])


def test_dream_says_when_a_used_up_budget_will_skip_the_pass(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """`dream milo` past its daily budget (on_exceed = skip_background) printed only "dream
    pass queued", and the pass was then skipped: it now warns that it will be, and until when;
    under the budget, nothing is said."""
    with_budget(fleet_root, "milo", 100)
    spend_today(env, "milo", "c1", 40)
    assert "budget is used up" not in invoke("dream", "milo").stderr
    spend_today(env, "milo", "c2", 90)
    result = invoke("dream", "milo")
    assert result.exit_code == 0, result.output
    assert "milo's daily budget is used up (132 of 100 tokens" in result.stderr
    assert "the pass will be skipped, until " in result.stderr
