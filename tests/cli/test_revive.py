"""`soulfleet revive`: a dead-lettered lane goes back into service; anything else is refused."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import lanes_for, run_soulfleet, settings_for
from tests.support.lanes import item
from workers.fleet import Fleet
from workers.fleet.errors import FleetError
from workers.queues import queue_name
from workers.settings import Settings


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        self.sent.append((lane, turn_id, kind))

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        self.sent.extend(turns)


def _dead_letter(env: Mapping[str, str | None], persona: str) -> Fleet:
    settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
    fleet = Fleet(settings, publisher=_Recorder())
    turn_id = fleet.post(persona, "hello", wake=True).turn_id
    for _ in range(settings.max_attempts):
        assert turn_id is not None
        started = fleet.lanes.start(persona, turn_id, "test-worker")
        failed = fleet.lanes.fail(persona, started.fence, error="model exploded")
        turn_id = failed.retry_turn_id
    assert fleet.lanes.status(persona)["state"] == "dead"
    return fleet


def _milo_gone_nora_dead(env: Mapping[str, str | None], fleet_root: Path) -> Fleet:
    """nora and milo dead-lettered, then milo's persona directory deleted."""
    fleet = _dead_letter(env, "nora")
    _dead_letter(env, "milo")
    shutil.rmtree(fleet_root / "milo")
    return fleet


def test_revive_queues_a_dead_lettered_lane_again(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """After N failures the lane is dead; `revive` queues it with its kept item, exit 0."""
    fleet = _dead_letter(env, "nora")
    result = invoke("revive", "nora")
    assert result.exit_code == 0, result.output
    assert "revived nora: turn" in result.stdout
    status = fleet.lanes.status("nora")
    assert status["state"] == "queued"
    assert status["attempts"] == 0
    assert status["inflight_items"] == 1


def test_revive_drop_kept_drops_the_dead_turns_items_and_keeps_later_posts(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A message the provider refuses for good (HTTP 400 on its content) dead-lettered the
    lane at every revive, since its kept items run first: `--drop-kept` drops the items the
    dead turn held, and the one posted since still runs. Refused with --all."""
    fleet = _dead_letter(env, "nora")
    fleet.post("nora", "posted since", wake=True)
    dead_work = fleet.lanes.client.hget(fleet.keys.lane("nora"), "commits")
    status = fleet.lanes.status("nora")
    assert (status["state"], status["inflight_items"], status["inbox_depth"]) == ("dead", 1, 1)
    # As a user runs it (its own process, its own logging): the report is the command's,
    # with no raw `[warning] lane.revived` log line beside it.
    result = run_soulfleet("revive", "nora", "--drop-kept", "--json", env=env)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert (answer["revived"], answer["items_dropped"]) == (True, 1)
    assert "lane.revived" not in result.stderr
    status = fleet.lanes.status("nora")
    assert (status["state"], status["inflight_items"], status["inbox_depth"]) == ("queued", 0, 1)
    started = fleet.lanes.start("nora", str(answer["turn_id"]), "test-worker")
    assert [item.text for item in started.items] == ["posted since"]
    # a work id of its own: the dead work's memory ledger does not answer its writes
    assert started.commits == int(dead_work or 0) + 1
    refused = invoke("revive", "--all", "--drop-kept")
    assert refused.exit_code == 2
    assert "--drop-kept takes one PERSONA" in refused.stderr


def test_revive_warns_as_post_does_of_a_model_key_this_shell_lacks(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A persona whose model needs a key: revive says it is not set here, as post does (the
    lane went back and died again on it within seconds, without a word)."""
    fleet = _dead_letter(env, "nora")
    toml = fleet_root / "nora" / "persona.toml"
    kept = [line for line in toml.read_text("utf-8").splitlines() if not line.startswith("model")]
    toml.write_text('model = "anthropic:claude-x"\n' + "\n".join(kept) + "\n", "utf-8")
    result = invoke("revive", "nora", environ={**env, "ANTHROPIC_API_KEY": ""})
    assert result.exit_code == 0, result.output
    assert "needs ANTHROPIC_API_KEY" in result.stderr
    assert fleet.lanes.status("nora")["state"] == "queued"


def test_revive_of_a_persona_still_broken_is_refused_and_the_lane_stays_dead(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A lane dead-lettered by a bad model spec, revived before the fix, was queued only to die
    again: `revive` now refuses with the persona.toml error (exit 2), as `post` does; once
    fixed it revives."""
    fleet = _dead_letter(env, "nora")
    toml = fleet_root / "nora" / "persona.toml"
    good = toml.read_text()
    toml.write_text(re.sub(r'(?m)^model = ".*"$', 'model = "openai-typo:gpt-4o-mini"', good))
    assert "openai-typo" in toml.read_text()
    result = invoke("revive", "nora")
    assert result.exit_code == 2, result.output
    assert "is not a model spec ('openai-typo:gpt-4o-mini')" in result.stderr
    assert fleet.lanes.status("nora")["state"] == "dead"
    toml.write_text(good)
    assert invoke("revive", "nora").exit_code == 0
    assert fleet.lanes.status("nora")["state"] == "queued"


def test_revive_of_a_lane_that_is_not_dead_fails_clearly(invoke: Invoke) -> None:
    """Reviving a healthy lane changes nothing and exits 1 with one line saying why."""
    result = invoke("revive", "milo")
    assert result.exit_code == 1
    assert "milo is not dead-lettered (it is idle)" in result.output
    as_json = invoke("revive", "milo", "--json")
    assert as_json.exit_code == 1
    payload = json.loads(as_json.stdout)
    assert payload["reason"] == "not dead-lettered"
    # the {"error", "exit"} every --json failure carries (it had neither, and no stderr line)
    assert payload["exit"] == 1
    assert payload["error"].startswith("lane milo is not dead-lettered (it is idle)")


def test_revive_of_an_unknown_persona_is_bad_input(invoke: Invoke) -> None:
    """An unknown persona is a usage error (exit 2), like every other fleet command."""
    result = invoke("revive", "nobody")
    assert result.exit_code == 2
    assert "nobody" in result.output


def _permanent(env: Mapping[str, str | None], persona: str, error: str) -> Fleet:
    settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
    fleet = Fleet(settings, publisher=_Recorder())
    turn_id = fleet.post(persona, "hello", wake=True).turn_id
    assert turn_id is not None
    started = fleet.lanes.start(persona, turn_id, "test-worker")
    assert fleet.lanes.fail(persona, started.fence, error=error, kind="permanent").dead
    return fleet


def test_revive_reason_takes_back_only_the_lanes_whose_last_error_matches(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """`--reason "http 401"` (any case) revives the lanes a bad key killed, not the others."""
    fleet = _permanent(env, "nora", "model call failed: authentication refused (HTTP 401)")
    _permanent(env, "milo", "PersonaConfigError: persona.toml: key 'every' bad")
    result = invoke("revive", "--reason", "http 401")
    assert result.exit_code == 0, result.output
    assert "revived nora: turn" in result.stdout
    assert "revived 1 dead-lettered lane(s) whose last error contains 'http 401'" in result.stdout
    assert fleet.lanes.status("nora")["state"] == "queued"
    assert fleet.lanes.status("milo")["state"] == "dead"


def test_revive_all_takes_back_every_dead_lane(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """`--all` revives every dead-lettered lane, whatever its reason; live lanes are untouched."""
    fleet = _permanent(env, "nora", "HTTP 401")
    _permanent(env, "milo", "persona.toml invalid")
    result = invoke("revive", "--all")
    assert result.exit_code == 0, result.output
    assert "revived 2 dead-lettered lane(s)" in result.stdout
    assert {fleet.lanes.status(n)["state"] for n in ("nora", "milo")} == {"queued"}
    assert fleet.lanes.counts()["dead"] == 0


def test_revive_all_leaves_a_persona_whose_files_still_fail_and_names_it(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """`--all` revives the lanes that can run and leaves dead, with the error `post` would
    give, a lane whose persona still fails (it would only die again); --json lists it."""
    fleet = _permanent(env, "nora", "HTTP 401")
    _permanent(env, "milo", "SOUL.md is a directory")
    (fleet_root / "milo" / "SOUL.md").unlink()
    (fleet_root / "milo" / "SOUL.md").mkdir()
    result = invoke("revive", "--all")
    assert result.exit_code == 0, result.output
    assert "revived 1 dead-lettered lane(s)" in result.stdout
    assert "not revived: milo, whose files still fail: PersonaFileError" in result.stdout
    assert fleet.lanes.status("nora")["state"] == "queued"
    assert fleet.lanes.status("milo")["state"] == "dead"
    payload = json.loads(invoke("revive", "--all", "--json").stdout)
    assert [entry["lane"] for entry in payload["still_broken"]] == ["milo"]
    assert "SOUL.md" in payload["still_broken"][0]["error"]


def test_revive_needs_a_persona_or_all_but_not_both(invoke: Invoke) -> None:
    """No target, or a persona with --all, is a usage error (exit 2) that says what to pass."""
    assert invoke("revive").exit_code == 2
    result = invoke("revive", "milo", "--all")
    assert result.exit_code == 2
    assert "not both" in result.output


def test_dead_lanes_of_a_removed_persona_are_named_and_never_revived(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A persona directory deleted after its lane died: `revive --all` leaves that lane (it
    could only die again) and says so; `status` names it so the dead count adds up."""
    fleet = _milo_gone_nora_dead(env, fleet_root)
    result = invoke("revive", "--all")
    assert result.exit_code == 0, result.output
    assert "revived 1 dead-lettered lane(s)" in result.stdout
    assert "not revived: 1 dead lane(s) whose persona directory is gone (milo)" in result.stdout
    assert fleet.lanes.status("nora")["state"] == "queued"
    assert fleet.lanes.status("milo")["state"] == "dead"
    status = invoke("status", "--state", "dead")
    assert "dead lanes of removed personas (1, their directories are gone" in status.stdout
    assert json.loads(invoke("status", "--json").stdout)["dead_persona_gone"] == ["milo"]


def test_reviving_a_removed_persona_by_name_says_how_to_remove_its_dead_lane(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """`revive milo` (or `status milo`) after milo's directory was deleted: exit 2 saying the
    directory is gone, naming the kept dead lane and `revive --forget-gone` (it said only
    "unknown persona", while status pointed at --forget-gone); a name that never was stays
    "unknown"."""
    fleet = _milo_gone_nora_dead(env, fleet_root)
    result = invoke("revive", "milo")
    assert result.exit_code == 2, result.output
    assert "persona 'milo' has no directory under" in result.stderr
    assert "dead-lettered lane(s) milo cannot run again" in result.stderr
    assert "`soulfleet revive --forget-gone`" in result.stderr
    assert fleet.lanes.status("milo")["state"] == "dead"
    status = invoke("status", "milo")  # the runbook's step 2 on a dead lane: the same answer
    assert status.exit_code == 2, status.output
    assert "`soulfleet revive --forget-gone`" in status.stderr
    never = invoke("revive", "zed")
    assert never.exit_code == 2
    assert "forget-gone" not in never.stderr


def test_forget_gone_removes_only_dead_lanes_of_removed_personas(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A dead lane whose persona directory is gone was never revived and never left the dead
    set (the dead-lettered alert fired for ever). `revive --forget-gone` removes it and the
    items it kept, saying how many; a dead lane of a persona still there is left alone."""
    fleet = _milo_gone_nora_dead(env, fleet_root)
    result = invoke("revive", "--forget-gone")
    assert result.exit_code == 0, result.output
    assert "forgot milo: its persona directory is gone; 1 kept item(s) dropped" in result.stdout
    assert "forgot 1 dead lane(s) of removed personas" in result.stdout
    assert fleet.orphaned_dead() == []
    assert fleet.lanes.status("milo")["state"] == "idle"  # no lane hash left
    assert fleet.client.zscore(fleet.keys.dead, "milo") is None
    assert fleet.lanes.status("nora")["state"] == "dead"
    again = json.loads(invoke("revive", "--forget-gone", "--json").stdout)
    assert again == {"forgotten": []}
    assert invoke("revive", "nora", "--forget-gone").exit_code == 2


def test_forget_gone_refuses_when_every_persona_would_look_gone(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path, tmp_path: Path
) -> None:
    """A personas root that is missing or empty (a volume not mounted) makes every persona
    look gone: `--forget-gone` refuses and removes nothing. So does a root other than the one
    beat's registry sync recorded for this Redis."""
    fleet = _dead_letter(env, "nora")
    empty = tmp_path / "empty"
    empty.mkdir()
    for root in (tmp_path / "not-mounted", empty):
        result = invoke("revive", "--forget-gone", environ={**env, "SOULFLEET_PERSONAS": str(root)})
        assert result.exit_code == 1, result.output
        assert "refusing to forget" in result.stderr
        assert "nothing was removed" in result.stderr
    other = tmp_path / "other"
    shutil.copytree(fleet_root, other)
    shutil.rmtree(other / "nora")
    fleet.client.set(fleet.keys.registry_root, str(fleet_root))
    result = invoke("revive", "--forget-gone", environ={**env, "SOULFLEET_PERSONAS": str(other)})
    assert result.exit_code == 2, result.output  # the CLI's own check of the served root
    assert "the fleet's workers read them from" in result.stderr
    elsewhere = Settings.from_env({**{k: v for k, v in env.items() if v is not None},
                                   "SOULFLEET_PERSONAS": str(other)})  # fmt: skip
    library = Fleet(elsewhere, publisher=_Recorder())
    try:
        with pytest.raises(FleetError, match="the fleet's beat serves"):
            library.forget_gone()  # the library's own refusal
    finally:
        library.client.close()
    assert fleet.lanes.status("nora")["state"] == "dead"


def test_a_queued_lane_lost_from_the_queue_index_is_named_and_revive_puts_it_back(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A Redis that evicted keys left lanes queued in their hash but missing from the queued
    index: not counted, never re-sent by the reaper, queued for ever, and `revive` said "not
    dead-lettered". status names them (--json: unindexed_lanes) and `revive NAME` puts the
    lane back and sends its turn again."""
    settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
    recorder = _Recorder()
    fleet = Fleet(settings, publisher=recorder)
    queued = fleet.post("nora", "hello", wake=True)
    fleet.lanes.client.zrem(fleet.keys.queued, "nora")  # the index entry evicted
    out = invoke("status").stdout
    assert "lanes lost from their index (1: nora)" in out
    assert json.loads(invoke("status", "--json").stdout)["unindexed_lanes"] == ["nora"]
    result = invoke("revive", "nora")
    assert result.exit_code == 0, result.output
    assert f"revived nora: turn {queued.turn_id} queued" in result.stdout
    assert fleet.lanes.client.zscore(fleet.keys.queued, "nora") is not None
    assert json.loads(invoke("status", "--json").stdout)["unindexed_lanes"] == []
    started = fleet.lanes.start("nora", str(queued.turn_id), "test-worker")
    assert [item.text for item in started.items] == ["hello"]


def test_revive_all_puts_back_every_lane_lost_from_the_queue_index(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """After an eviction took many index entries, `revive --all` puts every such lane back
    (a dreamer lane too, whose name `revive NAME` does not take), and says so."""
    settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
    fleet = Fleet(settings, publisher=_Recorder())
    fleet.post("nora", "hello", wake=True)
    fleet.dream("milo")
    fleet.lanes.client.zrem(fleet.keys.queued, "nora", "milo-dreamer")
    result = invoke("revive", "--all", "--json")
    assert result.exit_code == 0, result.output
    put_back = {entry["lane"] for entry in json.loads(result.stdout)["put_back"]}
    assert put_back == {"nora", "milo-dreamer"}
    assert json.loads(invoke("status", "--json").stdout)["unindexed_lanes"] == []


def test_revive_runs_a_lane_waiting_out_a_long_retry_now(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A provider's Retry-After held lanes up to an hour after it was back, and `revive` said
    "not dead-lettered (it is retry): nothing to revive", leaving no way to retry sooner: it
    now queues the lane's turn at once (attempt count kept) and says so."""
    lanes = lanes_for(env)
    outcome = lanes.post("ava", item("are you back?"), wake=True)
    assert outcome.turn_id is not None
    started = lanes.start("ava", outcome.turn_id, "w1")
    failed = lanes.fail("ava", started.fence, error="rate limited", kind="transient",
                        backoff=(2.0, 300.0), wait_at_least=3600.0)  # fmt: skip
    assert lanes.status("ava")["state"] == "retry"
    result = invoke("revive", "ava")
    assert result.exit_code == 0, result.output
    assert "was waiting out a retry backoff" in result.stdout
    status = lanes.status("ava")
    assert status["state"] == "queued"
    assert failed.retry_at is not None
    settings = settings_for(env)  # and its turn is sent (kombu's global_keyprefix, app.py)
    queue = f"{settings.key_prefix}broker:{queue_name(settings.queue_prefix, 'interactive')}"
    [message] = lanes.client.lrange(queue, 0, -1)
    assert str(status["turn_id"]) in str(message)
    assert lanes.client.zscore(lanes.keys.retry, "ava") is None
    assert lanes.client.zscore(lanes.keys.queued, "ava") is not None
    # an idle lane is still refused, as before
    assert invoke("revive", "milo").exit_code == 1
    # --drop-kept drops the items the failed turn held, as for a dead lane (it was ignored)
    started = lanes.start("ava", str(status["turn_id"]), "w1")
    assert len(started.items) == 1
    lanes.fail("ava", started.fence, error="HTTP 400", kind="transient",
               backoff=(2.0, 300.0), wait_at_least=3600.0)  # fmt: skip
    dropped = invoke("revive", "ava", "--drop-kept")
    assert dropped.exit_code == 0, dropped.output
    assert "1 item(s) the failed turn held dropped" in dropped.stdout
    assert lanes.client.llen(lanes.keys.inflight("ava")) == 0


def test_running_retrying_and_deferred_lanes_lost_from_their_index_are_named_and_put_back(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """An evicting Redis took lanes:running, lanes:retry and a provider's deferred set: their
    lanes stayed running, retrying or deferred for ever (no reaper, release or resume pass
    sees them), status promised the reaper would take one back, and revive said "not
    dead-lettered". status names all three; `revive --all` puts each back where a pass sees it:
    the running one for the reaper, the deferred one for the breaker, the retrying one now."""
    settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
    fleet = Fleet(settings, publisher=_Recorder())
    lanes = fleet.lanes
    for name in ("nora", "milo", "ava"):
        turn = fleet.post(name, f"hello {name}", wake=True).turn_id
        started = lanes.start(name, str(turn), "w")
        if name == "milo":
            lanes.fail(name, started.fence, error="HTTP 500", kind="transient",
                       backoff=(600.0, 600.0), jitter=1.0)  # fmt: skip
        if name == "ava":
            lanes.defer(name, started.fence, provider="openai", why="breaker open")
    client = lanes.client
    client.delete(fleet.keys.running, fleet.keys.retry, fleet.keys.deferred("openai"),
                  fleet.keys.breakers)  # fmt: skip
    client.delete(fleet.keys.lease("nora"))  # its worker gone: only the reaper could help
    status = json.loads(invoke("status", "--json").stdout)
    assert sorted(status["unindexed_lanes"]) == ["ava", "milo", "nora"]
    table = invoke("status").stdout
    assert "lanes lost from their index (3: " in table
    assert "reaper takes the lane back" not in table  # no pass sees it: the row says so
    assert "LOST from its index" in invoke("status", "nora").stdout
    one = invoke("revive", "nora")
    assert one.exit_code == 0, one.output
    assert "put back nora: running but lost from the running index" in one.stdout
    result = invoke("revive", "--all")
    assert result.exit_code == 0, result.output
    assert "put back ava: deferred but lost from its provider's index" in result.stdout
    # Back where beat's release finds it at its retry time: --all runs no retry early.
    assert "put back milo: retrying but lost from the retry index" in result.stdout
    assert client.zscore(fleet.keys.running, "nora") == 0
    assert client.zscore(fleet.keys.deferred("openai"), "ava") is not None
    assert client.sismember(fleet.keys.breakers, "openai")  # where recovery finds it
    assert lanes.status("milo")["state"] == "retry"
    retry_at = lanes.status("milo")["retry_at"]
    assert isinstance(retry_at, float)
    assert client.zscore(fleet.keys.retry, "milo") == retry_at * 1000
    assert json.loads(invoke("status", "--json").stdout)["unindexed_lanes"] == []
    assert [r.lane for r in fleet.reap()] == ["nora"]  # back in its index: the reaper sees it
