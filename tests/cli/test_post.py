"""`soulfleet post PERSONA TEXT`: one inbox item through Fleet.post, refusals loud."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import (
    PASSWORD,
    closed_port_url,
    dead_letter,
    lanes_for,
    settings_for,
    sync_registry,
)
from tests.support.tmpfs import fill, tmpfs
from workers.persona import python_tools
from workers.persona.inbox import InboxItem
from workers.persona.storage import MIN_FREE_BYTES, STORAGE_MARK
from workers.queues import queue_name


def test_post_no_wake_keeps_the_item_with_its_provenance(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """--no-wake puts the item in the inbox with --from/--channel and queues no turn."""
    result = invoke(
        "post", "ava", "hello there", "--no-wake", "--from", "tester", "--channel", "sms"
    )
    assert result.exit_code == 0, result.output
    assert "posted to ava" in result.stdout
    assert "not woken" in result.stdout
    lanes = lanes_for(env)
    status = lanes.status("ava")
    assert status["state"] == "idle"
    assert status["inbox_depth"] == 1
    raw = lanes.client.lindex(lanes.keys.inbox("ava"), 0)
    item = InboxItem.from_json(str(raw))
    assert (item.text, item.sender, item.channel) == ("hello there", "tester", "sms")


def test_post_no_wake_says_when_no_heartbeat_will_read_the_item(
    invoke: Invoke, fleet_root: Path
) -> None:
    """A --no-wake item is read by the persona's next heartbeat: nora has none, and a blank
    HEARTBEAT.md (what `soulfleet init` scaffolds) has every heartbeat skipped, so each says
    the item waits for a post that wakes it (it said only "not woken", and the item waited
    indefinitely). ava's heartbeat reads it: nothing more is said."""
    assert "it has no heartbeat" in invoke("post", "nora", "one", "--no-wake").stdout
    out = invoke("post", "ava", "two", "--no-wake").stdout
    assert out.rstrip().endswith("not woken (--no-wake)")
    (fleet_root / "ava" / "HEARTBEAT.md").write_text("# Heartbeat\n\n<!-- nothing yet -->\n")
    out = invoke("post", "ava", "three", "--no-wake").stdout
    assert "every heartbeat of it is skipped (blank_heartbeat" in out
    assert "waits for the next post that wakes it" in out
    payload = json.loads(invoke("post", "ava", "four", "--no-wake", "--json").stdout)
    assert str(payload["no_heartbeat_reads_it"]).startswith("every heartbeat of it is skipped")
    payload = json.loads(invoke("post", "milo", "five", "--no-wake", "--json").stdout)
    assert payload["no_heartbeat_reads_it"] is None


def test_post_no_wake_outside_active_hours_says_when_a_heartbeat_reads_it(
    invoke: Invoke, fleet_root: Path
) -> None:
    """milo beats only inside an active_hours window that opens in two hours: a --no-wake item
    waits that long, and the post said only "not woken". It names the window now."""
    opens = time.gmtime(time.time() + 2 * 3600)
    closes = time.gmtime(time.time() + 3 * 3600)
    toml = fleet_root / "milo" / "persona.toml"
    toml.write_text(
        toml.read_text(encoding="utf-8")
        + f'active_hours = {{ start = "{opens.tm_hour:02d}:{opens.tm_min:02d}", '
        f'end = "{closes.tm_hour:02d}:{closes.tm_min:02d}" }}\n',
        encoding="utf-8",
    )
    out = invoke("post", "milo", "later", "--no-wake").stdout
    assert "it is outside its heartbeat.active_hours now" in out
    assert f"({opens.tm_hour:02d}:{opens.tm_min:02d}-" in out
    assert "waits for the first heartbeat after the window opens" in out


def test_post_keeps_to_the_fleets_inbox_limit_not_the_shells(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """beat records the fleet's SOULFLEET_INBOX_MAX (2 here); a shell with its own, larger one
    still has its third post refused, exit 1, the inbox held at the fleet's limit (it took the
    shell's and filled the inbox past it)."""
    sync_registry({**env, "SOULFLEET_INBOX_MAX": "2"})
    shell = {**env, "SOULFLEET_INBOX_MAX": "5000"}
    for n in range(2):
        assert invoke("post", "ava", f"m{n}", "--no-wake", environ=shell).exit_code == 0
    refused = invoke("post", "ava", "one too many", "--no-wake", environ=shell)
    assert refused.exit_code == 1, refused.output
    assert "full" in refused.stderr
    assert lanes_for(env).status("ava")["inbox_depth"] == 2


def test_a_post_to_a_dead_lettered_lane_is_kept_and_exits_1(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """The item is kept (a revive runs it), but no turn reads it until then: exit 1, as the
    README's exit codes say, plain and --json (it exited 0 and a script took it as posted)."""
    lanes = lanes_for(env)
    dead_letter(lanes, "ava")
    plain = invoke("post", "ava", "anyone there?")
    assert plain.exit_code == 1, plain.output
    assert "no turn reads it until `soulfleet revive ava`" in plain.stdout
    as_json = invoke("post", "ava", "and now?", "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["outcome"] == "dead"
    kept = lanes.status("ava")
    assert (kept["inbox_depth"], kept["inflight_items"]) in ((2, 0), (1, 1), (0, 2))


def test_post_wake_queues_an_interactive_turn(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """With --wake (the default) an idle persona's lane is queued and the turn id printed."""
    result = invoke("post", "milo", "wake up")
    assert result.exit_code == 0, result.output
    status = lanes_for(env).status("milo")
    assert status["state"] == "queued"
    assert status["kind"] == "interactive"
    assert f"turn {status['turn_id']} queued" in result.stdout


def test_a_post_whose_broker_refuses_is_accepted_and_says_not_to_post_again(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """The broker (CELERY_BROKER_URL, here a port nobody listens on) refuses the wake-up after
    the item is in the inbox: exit 0, saying the wake-up was not sent, that the reaper sends
    it, and not to post again (exit 1 made a sender post twice)."""
    refusing = {**env, "CELERY_BROKER_URL": closed_port_url()}
    result = invoke("post", "milo", "wake up", environ=refusing)
    assert result.exit_code == 0, result.output
    assert "wake-up could not be sent" in result.stdout
    assert "at its next pass (SOULFLEET_REAP_INTERVAL)" in result.stdout
    assert "Do not post again" in result.stdout
    status = lanes_for(env).status("milo")
    assert status["inbox_depth"] == 1
    assert status["state"] == "queued"
    assert status["queued_at"] == 0.0  # handed to the reaper's next pass


def test_post_accepts_a_path_inside_the_root(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """PERSONA may be the path of a persona directory under the root."""
    root = env["SOULFLEET_PERSONAS"]
    assert root is not None
    result = invoke("post", f"{root}/nora", "by path", "--no-wake")
    assert result.exit_code == 0, result.output
    assert lanes_for(env).status("nora")["inbox_depth"] == 1


def test_post_unknown_persona_exit_2(invoke: Invoke) -> None:
    """An unknown persona is one line on stderr naming it, exit 2."""
    result = invoke("post", "nobody", "hi")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "unknown persona 'nobody'" in result.stderr


def test_post_directory_outside_the_root_says_so(invoke: Invoke, tmp_path: object) -> None:
    """A real directory outside the root is refused with a hint at --personas / run --local."""
    result = invoke("post", str(tmp_path), "hi")
    assert result.exit_code == 2
    assert "only reach personas under the fleet's root" in result.stderr
    # One statement of where it is, not "no directory ... (that directory exists ...)".
    assert "is a directory outside the personas root" in result.stderr
    assert "no directory" not in result.stderr


def test_a_path_that_does_not_exist_is_not_said_to_be_under_the_root(invoke: Invoke) -> None:
    """`post /nonexistent hi` named "no directory '/nonexistent' under <root>", as though an
    absolute path were looked up under the root: now it says there is no such directory."""
    result = invoke("post", "/nonexistent/ava", "hi")
    assert result.exit_code == 2
    assert "no directory '/nonexistent/ava'; a persona is a subdirectory of" in result.stderr
    assert "'/nonexistent/ava' under" not in result.stderr


def test_post_inbox_full_exit_1(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """A full inbox refuses the item loudly (exit 1) and keeps what was there."""
    full = {**env, "SOULFLEET_INBOX_MAX": "1"}
    assert invoke("post", "ava", "one", "--no-wake", environ=full).exit_code == 0
    result = invoke("post", "ava", "two", "--no-wake", environ=full)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "inbox of lane 'ava' is full" in result.stderr
    assert lanes_for(env).status("ava")["inbox_depth"] == 1


def test_post_redis_unreachable_names_url_without_password(
    invoke: Invoke, dead_redis_env: Mapping[str, str | None]
) -> None:
    """Redis down: exit 1, one line naming the URL with *** for the password, suggesting up."""
    result = invoke("post", "ava", "hi", environ=dead_redis_env)
    assert result.exit_code == 1
    url = str(dead_redis_env["REDIS_URL"])
    assert PASSWORD not in result.output
    assert url.replace(PASSWORD, "***") in result.stderr
    assert "soulfleet up" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("variable", "value"),
    [("SOULFLEET_INBOX_MAX", "lots"), ("REDIS_URL", "http://example.com")],
)
def test_post_invalid_settings_exit_2(
    invoke: Invoke, env: Mapping[str, str | None], variable: str, value: str
) -> None:
    """An invalid setting fails with exit 2 and one line naming the variable."""
    result = invoke("post", "ava", "hi", environ={**env, variable: value})
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert variable in result.stderr


def test_post_is_untrusted_whatever_from_says_unless_trusted_is_given(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """--from ava/cli no longer makes an item trusted: the stored item says trusted=false;
    --trusted stores trusted=true."""
    assert invoke("post", "ava", "one", "--no-wake", "--from", "ava/cli").exit_code == 0
    assert invoke("post", "ava", "two", "--no-wake", "--trusted").exit_code == 0
    lanes = lanes_for(env)
    raws = lanes.client.lrange(lanes.keys.inbox("ava"), 0, -1)
    items = [InboxItem.from_json(str(raw)) for raw in raws]
    assert [(i.text, i.trusted) for i in items] == [("one", False), ("two", True)]


def test_a_post_where_no_beat_sweeps_says_the_item_waits_for_a_fleet(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """Under a key prefix no beat has swept (a prefix or Redis other than the fleet's, or no
    fleet at all) the item is accepted, and stderr says it waits there and what to set; once
    a beat sweeps there, or after it stopped sweeping, the hint follows it."""
    result = invoke("post", "milo", "wake up")
    assert result.exit_code == 0, result.output
    assert "no beat has ever swept under key prefix" in result.stderr
    assert "give this shell its REDIS_URL and SOULFLEET_KEY_PREFIX" in result.stderr
    lanes = lanes_for(env)
    lanes.client.set(lanes.keys.last_sweep, json.dumps({"at": time.time()}))
    result = invoke("post", "milo", "again")
    assert result.exit_code == 0, result.output
    assert "beat" not in result.stderr
    lanes.client.set(lanes.keys.last_sweep, json.dumps({"at": time.time() - 3600}))
    result = invoke("post", "milo", "and again", "--json")
    assert result.exit_code == 0, result.output
    assert "beat has stopped sweeping under key prefix" in result.stderr
    # Workers may well still run (they answered at once while this said the item waited for
    # a fleet): what waits is beat's part.
    assert "(last sweep 360" in result.stderr  # 3600s or a second more
    assert "the turn that takes this item runs if workers still run" in result.stderr
    assert "waits until a fleet" not in result.stderr
    assert json.loads(result.stdout)["outcome"] == "pending"  # joins the queued turn
    unwoken = invoke("post", "milo", "later", "--no-wake", "--json")
    assert "this item waits for a turn (a heartbeat, which beat sends" in unwoken.stderr


def test_a_post_to_a_persona_on_a_full_disk_is_accepted_with_a_warning(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """The persona's home has under a MiB free: the item is accepted (its turn waits the disk
    out) and stderr says why it will not run yet, naming the directory."""
    with tmpfs(fleet_root / "full", "2m") as home:
        (home / "SOUL.md").write_text("You are Full.\n")
        fill(home, leave=MIN_FREE_BYTES // 2)
        result = invoke("post", "full", "hello")
        assert result.exit_code == 0, result.output
        assert "posted to full" in result.stdout
        assert f"warning: {STORAGE_MARK} at {home}" in result.stderr


def test_a_tool_import_still_running_is_accepted_with_a_warning_not_refused(
    invoke: Invoke,
    env: Mapping[str, str | None],
    fleet_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Python tool whose import is still running at its limit is transient (the fleet's
    turns retry it): `post` queues the item and says so on stderr, exit 0. It refused the
    post as invalid input (exit 2) and the person's message was not delivered; `run --local`,
    which needs the tool now, fails as a runtime failure (exit 1, "transient"), not exit 2."""
    monkeypatch.setattr(python_tools, "SETUP_TIMEOUT", 0.3)
    module = f"slow_import_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text("import threading\nthreading.Event().wait(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with (fleet_root / "ava" / "persona.toml").open("a") as toml:
        toml.write(f'\n[[tools.python]]\nref = "{module}:tool"\n')
    result = invoke("post", "ava", "hello", "--no-wake")
    assert result.exit_code == 0, result.output
    assert "did not finish within 0.3s" in result.stderr
    assert "accepted all the same" in result.stderr
    assert "posted to ava" in result.stdout
    assert lanes_for(env).status("ava")["inbox_depth"] == 1
    local = invoke("run", "ava", "hi", "--local")
    assert local.exit_code == 1, local.output
    assert "(transient: try again)" in local.stderr
    # the rest of the check-up still runs: a scripted rules file that is not there is refused,
    # exit 2, where the slow import stopped the check-up before it
    with (fleet_root / "ava" / "persona.toml").open() as toml:
        text = toml.read()
    (fleet_root / "ava" / "persona.toml").write_text(
        text.replace('model = "inherit"', 'model = "scripted:no-such-rules.toml"')
    )
    refused = invoke("post", "ava", "hello again", "--no-wake")
    assert refused.exit_code == 2, refused.output


def test_a_full_inbox_on_an_idle_lane_gets_a_turn_to_drain_it(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """Items posted --no-wake until the inbox was full, to a persona no heartbeat reads: every
    later post was refused with "retry after the persona's next turn drains it", and no turn
    ever came. A refused post that asks to wake now queues that turn (its own item is still
    refused) and says so; refused without a wake, it says nothing will drain the inbox."""
    sync_registry({**env, "SOULFLEET_INBOX_MAX": "2"})
    for n in range(2):
        assert invoke("post", "nora", f"m{n}", "--no-wake").exit_code == 0
    unwoken = invoke("post", "nora", "one more", "--no-wake")
    assert unwoken.exit_code == 1, unwoken.output
    assert "no turn is queued to drain it" in unwoken.stderr
    lanes = lanes_for(env)
    assert lanes.status("nora")["state"] == "idle"
    woken = invoke("post", "nora", "one more")
    assert woken.exit_code == 1, woken.output
    assert "a turn to drain it was queued just now" in woken.stderr
    status = lanes.status("nora")
    assert (status["state"], status["inbox_depth"]) == ("queued", 2)
    assert status["kind"] == "interactive"
    # and its message was sent: a worker consuming the queue runs it
    settings = settings_for(env)
    queue = queue_name(settings.queue_prefix, "interactive")
    # kombu's global_keyprefix (workers/app.py) namespaces the broker's lists
    [message] = lanes.client.lrange(f"{settings.key_prefix}broker:{queue}", 0, -1)
    assert str(status["turn_id"]) in str(message)
    again = invoke("post", "nora", "and another")
    assert "retry after the persona's next turn drains it" in again.stderr
