"""Lane transitions on a real Redis: every script's normal and rejection paths."""

from __future__ import annotations

import json
from typing import cast

import pytest
import redis

from tests.support.lanes import dump_keys, item, make_lanes
from workers.fleet.errors import InboxFull, ItemTooLarge, LeaseLost, RedisUnavailable
from workers.fleet.keys import Keys
from workers.fleet.lanes import LAST_TEXT_MAX, Lanes, work_id
from workers.local.redis_server import free_port
from workers.persona.clock import VirtualClock


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=1_700_000_000.0)


@pytest.fixture
def lanes(redis_client: redis.Redis, key_prefix: str, clock: VirtualClock) -> Lanes:
    return make_lanes(redis_client, key_prefix, clock=clock)


@pytest.fixture
def keys(key_prefix: str) -> Keys:
    return Keys(key_prefix)


def _queued_turn(lanes: Lanes, lane: str = "ava") -> str:
    outcome = lanes.post(lane, item("hello"), wake=True)
    assert outcome.turn_id is not None
    return outcome.turn_id


def _crash(client: redis.Redis, keys: Keys, lane: str = "ava") -> None:
    # A SIGKILLed worker stops renewing: its lease key expires. Deleting it is the same state.
    client.delete(keys.lease(lane))


# -- post -------------------------------------------------------------------------------------
def test_post_with_wake_queues_an_interactive_turn_on_an_idle_lane(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """A woken post to an idle lane queues one interactive turn and indexes it as queued."""
    new = item("hi")
    outcome = lanes.post("ava", new, wake=True)
    assert (outcome.outcome, outcome.turn_kind, outcome.depth) == ("queued", "interactive", 1)
    assert outcome.item_id == new.id
    assert redis_client.hget(keys.lane("ava"), "turn_id") == outcome.turn_id
    assert redis_client.zscore(keys.queued, "ava") == 1_700_000_000_000
    assert redis_client.lrange(keys.inbox("ava"), 0, -1) == [new.to_json()]


def test_post_without_wake_or_to_a_busy_lane_queues_nothing(lanes: Lanes) -> None:
    """An item posted without wake, or while a turn is queued, waits: no new turn id."""
    quiet = lanes.post("ava", item("a"), wake=False)
    assert (quiet.outcome, quiet.turn_id) == ("pending", None)
    assert lanes.status("ava")["state"] == "idle"
    first = lanes.post("ava", item("b"), wake=True)
    second = lanes.post("ava", item("c"), wake=True)
    assert first.outcome == "queued"
    assert (second.outcome, second.turn_id, second.depth) == ("pending", None, 3)


def test_full_inbox_rejects_loudly_and_writes_nothing(
    lanes: Lanes, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Posting to a full inbox raises InboxFull naming lane and limit; nothing of the lane
    changes, and the fleet's reject count in Redis (what beat exports: the posting process is
    seldom scraped) goes up by one."""
    for n in range(5):
        lanes.post("ava", item(f"m{n}"), wake=True)
    before = dump_keys(redis_client, key_prefix)
    with pytest.raises(InboxFull) as caught:
        lanes.post("ava", item("one too many"), wake=True)
    assert caught.value.lane == "ava"
    assert caught.value.limit == 5
    assert "full" in str(caught.value)
    assert "nothing was dropped" in str(caught.value)
    after = dump_keys(redis_client, key_prefix)
    assert after.pop(lanes.keys.inbox_rejects) == ("string", "1")
    assert after == before


def test_a_post_that_asks_for_a_new_session_ends_it_only_if_accepted(
    lanes: Lanes, redis_client: redis.Redis
) -> None:
    """`run --new-session` with an item the inbox refused ended the conversation all the
    same (the reset came first): the epoch moves with an accepted item, in the same step,
    and not at all with a refused one (full inbox, item too large)."""
    lane = lanes.keys.lane("ava")
    lanes.post("ava", item("keep me"), wake=False, new_session=True)
    assert redis_client.hget(lane, "session_epoch") == "1"
    for n in range(4):
        lanes.post("ava", item(f"m{n}"), wake=False)
    with pytest.raises(InboxFull):
        lanes.post("ava", item("refused"), wake=False, new_session=True)
    with pytest.raises(ItemTooLarge):
        lanes.post("ava", item("x" * 100_000), wake=False, new_session=True)
    assert redis_client.hget(lane, "session_epoch") == "1"


def test_a_retry_keeps_the_session_its_work_began_in_and_the_reset_goes_to_the_next_turn(
    lanes: Lanes,
) -> None:
    """A's turn fails and waits to retry; `run --new-session B` then resets the session. The
    retry (A alone) still reads the session A began in (its request is the one it sent, so a
    paid answer replays), and B's turn, after it, is the one that reads the new epoch (it
    continued the session the retry started instead)."""
    a, b = item("A"), item("B")
    turn = lanes.post("ava", a, wake=True).turn_id
    assert turn is not None
    first = lanes.start("ava", turn, "w")
    assert first.session_epoch == 0
    retry = lanes.fail("ava", first.fence, error="HTTP 500", kind="transient").retry_turn_id
    assert retry is not None
    lanes.post("ava", b, wake=True, new_session=True)
    again = lanes.start("ava", retry, "w")
    assert ([i.id for i in again.items], again.session_epoch) == ([a.id], 0)
    done = lanes.finish("ava", again.fence, status="done", text="ok")
    assert done.follow_up_turn_id is not None
    follow = lanes.start("ava", done.follow_up_turn_id, "w")
    assert ([i.id for i in follow.items], follow.session_epoch) == ([b.id], 1)


def test_item_over_the_byte_limit_is_refused_before_redis(redis_url: str) -> None:
    """ItemTooLarge comes before any Redis call: even an unreachable Redis is never asked."""
    dead = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", decode_responses=True)
    lanes = make_lanes(dead, "x:", item_max_bytes=100)
    with pytest.raises(ItemTooLarge) as caught:
        lanes.post("ava", item("é" * 200), wake=True)
    assert caught.value.limit == 100
    assert caught.value.size > 400
    # The size counts the envelope: the message says how much of it is the text, and how
    # large a text would fit (the item's other fields take the rest, and a text's escapes
    # count at the rate it has them: 1,500 newlines store as 3,000 bytes).
    assert "its text 400 bytes" in str(caught.value)
    roomy = make_lanes(dead, "x:", item_max_bytes=2000)
    for char in ("é", "\n", "a"):
        text = char * 2100
        with pytest.raises(ItemTooLarge) as caught:
            roomy.post("ava", item(text), wake=True)
        most = int(str(caught.value).rsplit("at most about ", 1)[1].split()[0])
        assert 0 < most < len(text.encode()), (char, most)
        fits = item(text.encode()[:most].decode("utf-8", "ignore"))
        assert len(fits.to_json().encode()) <= 2000, char
        over = item(text.encode()[: most + 64].decode("utf-8", "ignore"))
        assert len(over.to_json().encode()) > 2000, char


def test_post_to_a_dead_lane_keeps_the_item_and_queues_nothing(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """A dead-lettered lane still accepts items (never dropped) but queues no turn."""
    redis_client.hset(keys.lane("ava"), mapping={"state": "dead"})
    kept = item("still here")
    outcome = lanes.post("ava", kept, wake=True)
    assert (outcome.outcome, outcome.turn_id) == ("dead", None)
    assert redis_client.lrange(keys.inbox("ava"), 0, -1) == [kept.to_json()]


# -- tick -------------------------------------------------------------------------------------
def test_tick_queues_an_idle_lane_by_kind_and_coalesces_otherwise(lanes: Lanes) -> None:
    """The first tick queues (heartbeat or dream turn); later ticks only add to the count."""
    first = lanes.tick("ava", kind="heartbeat")
    assert (first.outcome, first.turn_kind) == ("queued", "heartbeat")
    again = lanes.tick("ava", kind="heartbeat", count=4)
    assert (again.outcome, again.turn_id) == ("coalesced", None)
    dream = lanes.tick("ava-dreamer", kind="dream")
    assert (dream.outcome, dream.turn_kind) == ("queued", "dream")
    assert lanes.status("ava")["pending_ticks"] == 5


def test_tick_on_a_dead_lane_changes_nothing(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, key_prefix: str
) -> None:
    """A tick on a dead lane reports dead_lettered and writes nothing."""
    redis_client.hset(keys.lane("ava"), mapping={"state": "dead", "ticks": 2})
    before = dump_keys(redis_client, key_prefix)
    outcome = lanes.tick("ava", kind="heartbeat")
    assert (outcome.outcome, outcome.turn_id) == ("dead_lettered", None)
    assert dump_keys(redis_client, key_prefix) == before


def test_tick_many_returns_one_outcome_per_pair_in_order(lanes: Lanes) -> None:
    """tick_many across batches keeps input order and gives each new turn its own id."""
    pairs = [(f"l{i % 700}", "dream" if i % 3 == 0 else "heartbeat") for i in range(1400)]
    outcomes = lanes.tick_many(pairs)
    assert [(o.lane, o.kind) for o in outcomes] == pairs
    assert [o.outcome for o in outcomes] == ["queued"] * 700 + ["coalesced"] * 700
    assert all(o.turn_kind == o.kind for o in outcomes[:700]), "the FIRST tick decides"
    ids = [o.turn_id for o in outcomes[:700]]
    assert len(set(ids)) == 700
    assert lanes.counts()["queued"] == 700


def test_tick_rejects_an_unknown_kind(lanes: Lanes) -> None:
    """Only heartbeat and dream ticks exist."""
    with pytest.raises(ValueError, match="tick kind"):
        lanes.tick_many([("ava", "interactive")])


def test_a_thousand_ticks_during_a_turn_make_exactly_one_follow_up_reporting_them(
    lanes: Lanes,
) -> None:
    """1,000 ticks while a turn runs: finish queues ONE follow-up, which starts with 1,000."""
    turn = _queued_turn(lanes)
    started = lanes.start("ava", turn, "w1")
    outcomes = lanes.tick_many([("ava", "heartbeat")] * 1000)
    assert {o.outcome for o in outcomes} == {"coalesced"}
    done = lanes.finish("ava", started.fence, status="done", text="ok")
    assert done.follow_up_kind == "heartbeat"
    assert done.follow_up_turn_id is not None
    assert lanes.counts()["queued"] == 1
    follow = lanes.start("ava", done.follow_up_turn_id, "w2")
    assert (follow.status, follow.ticks, follow.items) == ("started", 1000, [])
    last = lanes.finish("ava", follow.fence, status="done", text="ok")
    assert last.follow_up_turn_id is None
    assert lanes.status("ava")["state"] == "idle"


# -- start ------------------------------------------------------------------------------------
def test_start_drains_inbox_and_ticks_into_inflight_under_a_new_fence(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """start takes a lease "<fence>:<worker>" and moves inbox + ticks into in-flight."""
    a, b = item("a"), item("b")
    turn = lanes.post("ava", a, wake=True).turn_id
    assert turn is not None
    lanes.post("ava", b, wake=True)
    lanes.tick("ava", kind="heartbeat", count=2)
    started = lanes.start("ava", turn, "w1")
    assert started.status == "started"
    assert [i.id for i in started.items] == [a.id, b.id]
    assert (started.ticks, started.recovered, started.attempt) == (2, 0, 1)
    assert started.kind == "interactive"
    assert redis_client.get(keys.lease("ava")) == f"{started.fence}:w1"
    assert 0 < redis_client.pttl(keys.lease("ava")) <= 30_000
    assert redis_client.llen(keys.inbox("ava")) == 0
    assert redis_client.llen(keys.inflight("ava")) == 2
    assert redis_client.zscore(keys.running, "ava") == 1_700_000_030_000
    assert lanes.counts() == {"queued": 0, "running": 1, "dead": 0}


def test_a_backlog_over_the_drain_bound_is_taken_over_several_turns(
    redis_client: redis.Redis, key_prefix: str, keys: Keys, clock: VirtualClock
) -> None:
    """A turn took the whole inbox: a backlog whose text alone was over the turn's token
    budget ended that turn before its model call, and every item went unanswered. A turn
    now takes items (in order) up to drain_max_bytes, the first one always; the rest stay in
    the inbox, and finish queues the turn that takes them."""
    big = [item("x" * 300) for _ in range(3)]
    bound = len(big[0].to_json()) * 2 + 10  # two items fit, three do not
    lanes = make_lanes(redis_client, key_prefix, clock=clock, drain_max_bytes=bound, inbox_max=20)
    turn = lanes.post("ava", big[0], wake=True).turn_id
    assert turn is not None
    for one in big[1:]:
        lanes.post("ava", one, wake=True)
    started = lanes.start("ava", turn, "w1")
    assert [i.id for i in started.items] == [big[0].id, big[1].id]
    assert redis_client.llen(keys.inbox("ava")) == 1
    finished = lanes.finish("ava", started.fence, status="done", text="two answered")
    assert finished.follow_up_turn_id is not None
    again = lanes.start("ava", finished.follow_up_turn_id, "w1")
    assert [i.id for i in again.items] == [big[2].id]
    assert redis_client.llen(keys.inbox("ava")) == 0
    # a retry holds no more: it takes nothing fresh (each attempt of a failing turn took
    # another bound, and the attempt after a long outage held the whole backlog again)
    for _ in range(6):
        lanes.post("ava", item("x" * 300), wake=True)
    done = lanes.finish("ava", again.fence, status="done", text="one answered")
    assert done.follow_up_turn_id is not None
    turn_id = done.follow_up_turn_id
    for _ in range(3):
        attempt = lanes.start("ava", turn_id, "w1")
        assert attempt.status == "started"
        assert len(attempt.items) == 2
        failed = lanes.fail("ava", attempt.fence, error="boom", kind="transient")
        assert failed.retry_turn_id is not None
        turn_id = failed.retry_turn_id
    # one item over the bound by itself is still taken, alone
    tiny = make_lanes(redis_client, key_prefix + "t:", clock=clock, drain_max_bytes=10)
    first = tiny.post("bob", big[0], wake=True).turn_id
    assert first is not None
    tiny.post("bob", big[1], wake=True)
    assert [i.id for i in tiny.start("bob", first, "w1").items] == [big[0].id]


def test_duplicate_and_stale_starts_are_rejected_and_change_nothing(
    lanes: Lanes, redis_client: redis.Redis, key_prefix: str
) -> None:
    """A second start of the running turn is a duplicate; any other turn id is stale."""
    turn = _queued_turn(lanes)
    started = lanes.start("ava", turn, "w1")
    before = dump_keys(redis_client, key_prefix)
    assert lanes.start("ava", turn, "w2").status == "duplicate"
    assert lanes.start("ava", "not-the-turn", "w2").status == "stale"
    assert lanes.start("nobody", "x", "w2").status == "stale"
    assert dump_keys(redis_client, key_prefix) == before
    lanes.finish("ava", started.fence, status="done", text="ok")
    assert lanes.start("ava", turn, "w3").status == "stale"


def test_start_after_a_crash_recovers_inflight_items_and_leaves_the_new_inbox_next(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """A redelivered turn whose worker died gets the dead turn's items and nothing more: an
    item and a tick that came meanwhile wait for the turn after it (the retry sends what the
    dead attempt sent, so the answers it paid for are replayed)."""
    a, b, c = item("a"), item("b"), item("c")
    turn = lanes.post("ava", a, wake=True).turn_id
    assert turn is not None
    lanes.post("ava", b, wake=True)
    first = lanes.start("ava", turn, "w1")
    lanes.tick("ava", kind="heartbeat")
    lanes.post("ava", c, wake=True)
    _crash(redis_client, keys)
    again = lanes.start("ava", turn, "w2")
    assert again.status == "started"
    assert [i.id for i in again.items] == [a.id, b.id]
    assert (again.recovered, again.ticks, again.attempt) == (2, 0, 2)
    assert again.fence == first.fence + 1
    with pytest.raises(LeaseLost):
        lanes.finish("ava", first.fence, status="done", text="zombie")
    done = lanes.finish("ava", again.fence, status="done", text="ok")
    assert done.follow_up_turn_id is not None
    follow = lanes.start("ava", done.follow_up_turn_id, "w3")
    assert (follow.ticks, [i.id for i in follow.items]) == (1, [c.id])


def test_a_retry_of_ticked_work_shows_its_first_count_and_folds_the_ticks_since(
    lanes: Lanes,
) -> None:
    """A heartbeat turn fails and 3 more ticks come before its retry (a backoff, an outage):
    the retry shows the count its attempt showed, so it sends the request that attempt sent
    and the call log replays the answer already paid for (it showed x4, and paid again); the
    3 fold into it, so its finish leaves no follow-up heartbeat to pay for them."""
    first = lanes.tick("ava", kind="heartbeat")
    assert first.turn_id is not None
    started = lanes.start("ava", first.turn_id, "w1")
    assert started.ticks == 1
    failed = lanes.fail("ava", started.fence, error="RedisUnavailable", kind="transient")
    assert failed.retry_turn_id is not None
    for _ in range(3):
        assert lanes.tick("ava", kind="heartbeat").outcome == "coalesced"
    retry = lanes.start("ava", failed.retry_turn_id, "w2")
    assert (retry.status, retry.ticks, retry.attempt) == ("started", 1, 1)
    again = lanes.fail("ava", retry.fence, error="RedisUnavailable", kind="transient")
    assert again.retry_turn_id is not None
    lanes.tick("ava", kind="heartbeat")
    third = lanes.start("ava", again.retry_turn_id, "w3")
    assert third.ticks == 1
    done = lanes.finish("ava", third.fence, status="done", text="HEARTBEAT_OK")
    assert done.follow_up_turn_id is None
    assert lanes.status("ava")["state"] == "idle"
    # The next work shows its own count again.
    nxt = lanes.tick("ava", kind="heartbeat", count=2)
    assert nxt.turn_id is not None
    assert lanes.start("ava", nxt.turn_id, "w4").ticks == 2


def test_a_retry_of_ticked_work_started_by_an_older_worker_keeps_one_count(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """Work an older worker started keeps no shown count: its first retry shows the ticks it
    holds and keeps that count for every retry after (it grew with each one)."""
    first = lanes.tick("ava", kind="heartbeat", count=2)
    assert first.turn_id is not None
    started = lanes.start("ava", first.turn_id, "w1")
    redis_client.hdel(keys.lane("ava"), "shown_ticks")  # as a start before it was kept
    turn_id = lanes.fail("ava", started.fence, error="x", kind="transient").retry_turn_id
    shown = []
    for worker in ("w2", "w3", "w4"):
        lanes.tick("ava", kind="heartbeat")
        assert turn_id is not None
        retry = lanes.start("ava", turn_id, worker)
        shown.append(retry.ticks)
        turn_id = lanes.fail("ava", retry.fence, error="x", kind="transient").retry_turn_id
    assert shown == [2, 2, 2]


def test_an_unparseable_inbox_entry_is_handed_over_not_dropped(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """Junk in the inbox reaches the turn as an untrusted item instead of vanishing."""
    turn = _queued_turn(lanes)
    redis_client.rpush(keys.inbox("ava"), "not json")
    started = lanes.start("ava", turn, "w1")
    assert [i.text for i in started.items] == ["hello", "not json"]
    assert started.items[1].channel == "unparseable"


# -- renew / holds ------------------------------------------------------------------------------
def test_renew_and_holds_follow_the_fence(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, clock: VirtualClock
) -> None:
    """renew extends the lease while the fence is current; after a takeover both say False."""
    turn = _queued_turn(lanes)
    started = lanes.start("ava", turn, "w1")
    redis_client.pexpire(keys.lease("ava"), 1000)
    clock.advance(10)
    assert lanes.holds("ava", started.fence)
    assert lanes.renew("ava", started.fence)
    assert redis_client.pttl(keys.lease("ava")) > 1000
    assert redis_client.zscore(keys.running, "ava") == 1_700_000_040_000
    assert not lanes.renew("ava", started.fence + 1)
    _crash(redis_client, keys)
    assert not lanes.holds("ava", started.fence)
    assert not lanes.renew("ava", started.fence)
    lanes.start("ava", turn, "w2")
    assert lanes.renew_many([("ava", started.fence), ("ava", started.fence + 1)]) == [False, True]


# -- finish -----------------------------------------------------------------------------------
def test_finish_commits_status_text_beat_and_replies(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, clock: VirtualClock
) -> None:
    """finish clears in-flight, records the turn, XADDs the beat and pushes replies with TTL."""
    asked = item("question", reply=True)
    turn = lanes.post("ava", asked, wake=True).turn_id
    assert turn is not None
    started = lanes.start("ava", turn, "w1")
    clock.advance(2)
    long_text = "x" * (LAST_TEXT_MAX + 50)
    done = lanes.finish(
        "ava", started.fence, status="done", text=long_text,
        beat={"persona": "ava", "text": "sky is falling"}, reply_ids=[asked.id],
    )  # fmt: skip
    assert (done.turn_id, done.follow_up_turn_id) == (turn, None)
    status = lanes.status("ava")
    assert status["state"] == "idle"
    assert (status["last_turn"], status["last_status"]) == (turn, "done")
    assert status["last_text"] == long_text[:LAST_TEXT_MAX]
    assert status["last_end"] == 1_700_000_002.0
    assert (status["attempts"], status["inflight_items"]) == (0, 0)
    assert redis_client.exists(keys.lease("ava")) == 0
    assert lanes.counts() == {"queued": 0, "running": 0, "dead": 0}
    ((beat_id, fields),) = cast(list[tuple[str, dict[str, str]]], redis_client.xrange(keys.beats))
    assert beat_id == done.beat_id
    assert fields == {
        "persona": "ava",
        "text": "sky is falling",
        "turn_id": turn,
        "time": repr(1_700_000_002.0),
    }
    reply_key = keys.reply(asked.id)
    assert [json.loads(r) for r in redis_client.lrange(reply_key, 0, -1)] == [
        {"text": long_text, "status": "done", "turn_id": turn}
    ]
    assert 0 < redis_client.pttl(reply_key) <= 60_000


def test_finish_with_a_stale_fence_raises_lease_lost_and_changes_nothing(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, key_prefix: str
) -> None:
    """A zombie's finish is refused: no state change, no beat, no reply."""
    asked = item("q", reply=True)
    turn = lanes.post("ava", asked, wake=True).turn_id
    assert turn is not None
    zombie = lanes.start("ava", turn, "w1")
    _crash(redis_client, keys)
    lanes.start("ava", turn, "w2")
    before = dump_keys(redis_client, key_prefix)
    with pytest.raises(LeaseLost) as caught:
        lanes.finish(
            "ava",
            zombie.fence,
            status="done",
            text="late",
            beat={"text": "late beat"},
            reply_ids=[asked.id],
        )
    assert (caught.value.lane, caught.value.fence) == ("ava", zombie.fence)
    assert "the fence is no longer current (the lane is running now)" in str(caught.value)
    assert dump_keys(redis_client, key_prefix) == before
    assert redis_client.exists(keys.beats, keys.reply(asked.id)) == 0


def test_an_end_refused_because_redis_lost_the_lane_says_so(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """Turns cut by a Redis that restarted empty were logged "fence is no longer current",
    as if another worker had taken the lane: the refusal says the lane's state is gone."""
    started = lanes.start("ava", _queued_turn(lanes), "w1")
    redis_client.delete(keys.lane("ava"))
    with pytest.raises(LeaseLost, match="the lane's state is gone from Redis"):
        lanes.finish("ava", started.fence, status="done", text="late")
    with pytest.raises(LeaseLost, match="the lane's state is gone from Redis"):
        lanes.fail("ava", started.fence, error="boom")


def test_finish_without_a_beat_publishes_nothing(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """No beat argument (a HEARTBEAT_OK turn) means no stream entry."""
    started = lanes.start("ava", _queued_turn(lanes), "w1")
    done = lanes.finish("ava", started.fence, status="done", text="HEARTBEAT_OK")
    assert done.beat_id is None
    assert redis_client.exists(keys.beats) == 0


def test_finish_queues_an_interactive_follow_up_when_items_arrived(lanes: Lanes) -> None:
    """Items posted during a turn make the follow-up interactive and are its items."""
    started = lanes.start("ava", _queued_turn(lanes), "w1")
    late = item("late")
    assert lanes.post("ava", late, wake=True).outcome == "pending"
    lanes.tick("ava", kind="heartbeat")
    done = lanes.finish("ava", started.fence, status="done", text="ok")
    assert done.follow_up_kind == "interactive"
    assert done.follow_up_turn_id is not None
    follow = lanes.start("ava", done.follow_up_turn_id, "w1")
    assert ([i.id for i in follow.items], follow.ticks) == ([late.id], 1)


def test_beats_stream_is_trimmed_near_beats_max(
    redis_client: redis.Redis, key_prefix: str, keys: Keys
) -> None:
    """finish trims the stream with MAXLEN ~ beats_max, so it stays bounded."""
    lanes = make_lanes(redis_client, key_prefix, beats_max=10)
    for n in range(300):
        started = lanes.start("ava", _queued_turn(lanes), "w")
        lanes.finish("ava", started.fence, status="done", text="t", beat={"text": f"b{n}"})
    assert 10 <= redis_client.xlen(keys.beats) < 300


def test_a_reply_reaches_its_caller_exactly_as_the_worker_encoded_it(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """finish.lua never decodes or re-encodes the reply (a large reply costs Redis one copy,
    not a cjson round trip): the stored payload is the worker's JSON byte for byte, with the
    turn id appended; cjson would have rewritten "/" as "\\/" and reordered the keys."""
    asked = item("question", reply=True)
    turn = lanes.post("ava", asked, wake=True).turn_id
    assert turn is not None
    started = lanes.start("ava", turn, "w1")
    text = "a/b é " + "z" * 100_000
    lanes.finish(
        "ava", started.fence, status="done", text=text, reply_ids=[asked.id],
        reply_extra={"usage": {"input_tokens": 3}, "limit": None},
    )  # fmt: skip
    [stored] = redis_client.lrange(keys.reply(asked.id), 0, -1)
    expected = json.dumps(
        {"usage": {"input_tokens": 3}, "limit": None, "text": text, "status": "done"},
        separators=(",", ":"),
    )
    assert stored == expected[:-1] + f',"turn_id":"{turn}"}}'
    assert json.loads(stored)["turn_id"] == turn


def test_each_beat_is_cut_to_beat_max_bytes_so_the_stream_is_bounded_in_bytes(
    redis_client: redis.Redis, key_prefix: str, keys: Keys
) -> None:
    """A beat's text over beat_max_bytes is cut (whole characters, with a notice pointing at
    the transcript): the stream holds at most beats_max entries of at most beat_max_bytes."""
    lanes = make_lanes(redis_client, key_prefix, beats_max=10, beat_max_bytes=512)
    for n in range(50):
        started = lanes.start("ava", _queued_turn(lanes), "w")
        text = f"{n} " + "é" * 5000
        lanes.finish("ava", started.fence, status="done", text=text, beat={"text": text})
    entries = cast(list[tuple[str, dict[str, str]]], redis_client.xrange(keys.beats))
    assert 10 <= len(entries) < 50
    for _, fields in entries:
        assert len(fields["text"].encode()) <= 512
        assert "[beat cut at 512 bytes of 1000" in fields["text"]
        assert fields["text"].endswith("; the transcript has it all]")
    assert sum(len(f["text"].encode()) for _, f in entries) <= 512 * len(entries)


def test_work_id_survives_failed_and_crashed_attempts_and_moves_on_with_a_commit(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """The work id a turn keys its memory writes with is the same for every attempt at the
    same work (after a fail and retry, after a crash and re-start) and changes once it commits."""
    started = lanes.start("ava", _queued_turn(lanes), "w1")
    work = work_id("ava", started.commits, started.born_ms)
    assert work == f"ava:{started.born_ms}:0"
    retry = lanes.fail("ava", started.fence, error="boom").retry_turn_id
    assert retry is not None
    again = lanes.start("ava", retry, "w2")
    assert work_id("ava", again.commits, again.born_ms) == work
    _crash(redis_client, keys)
    third = lanes.start("ava", retry, "w3")
    assert third.status == "started"
    assert work_id("ava", third.commits, third.born_ms) == work
    lanes.finish("ava", third.fence, status="done", text="ok")
    assert again.fence < third.fence
    fourth = lanes.start("ava", _queued_turn(lanes), "w1")
    assert work_id("ava", fourth.commits, fourth.born_ms) == f"ava:{started.born_ms}:1"


def test_a_lane_whose_redis_state_was_lost_never_reuses_a_work_id(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, clock: VirtualClock
) -> None:
    """Redis lost the lane (no AOF, a flushed database): its commit count starts from 0 again,
    but the work id does not repeat, so the persona's write ledger cannot answer the new
    turns' memory writes as "already applied" and skip them."""
    first = lanes.start("ava", _queued_turn(lanes), "w1")
    lanes.finish("ava", first.fence, status="done", text="ok")
    redis_client.delete(*keys.lane_keys("ava"))
    clock.advance(1)
    again = lanes.start("ava", _queued_turn(lanes), "w1")
    assert (again.status, again.commits) == ("started", 0)
    assert again.born_ms != first.born_ms
    assert work_id("ava", again.commits, again.born_ms) != work_id("ava", 0, first.born_ms)


def test_start_returns_what_the_turn_needs_to_know_about_its_lane(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """The work id's commit count, the current session state and epoch, and the dreamer's
    last pass come back with the start itself (no second round trip), as Redis holds them."""
    first = lanes.start("ava", _queued_turn(lanes), "w1")
    assert (first.commits, first.session, first.session_epoch, first.last_pass_ms) == (
        0,
        None,
        0,
        None,
    )
    redis_client.hset(keys.lane("ava"), mapping={
        "commits": 7, "session": "s1.f3.json", "session_epoch": 2, "last_pass": 1234,
    })  # fmt: skip
    lanes.finish("ava", first.fence, status="done", text="ok")
    second = lanes.start("ava", _queued_turn(lanes), "w1")
    assert second.status == "started"
    assert (second.commits, second.session, second.session_epoch, second.last_pass_ms) == (
        8,
        "s1.f3.json",
        2,
        1234,
    )
    assert work_id("ava", second.commits, second.born_ms) == f"ava:{first.born_ms}:8"


# -- fail / attempts / dead-letter ----------------------------------------------------------------
def test_fail_retries_then_dead_letters_after_max_attempts_with_the_error_visible(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """Each failure re-queues on the same queue until max_attempts; then the lane is dead."""
    kept = item("keep me")
    turn = lanes.post("ava", kept, wake=True).turn_id
    for attempt in (1, 2, 3):
        assert turn is not None
        started = lanes.start("ava", turn, "w1")
        assert (started.status, started.attempt) == ("started", attempt)
        assert [i.id for i in started.items] == [kept.id]
        failed = lanes.fail("ava", started.fence, error=f"boom {attempt}")
        turn = failed.retry_turn_id
        assert failed.kind == "interactive"
    assert failed.dead
    assert failed.retry_turn_id is None
    status = lanes.status("ava")
    assert (status["state"], status["last_error"], status["attempts"]) == ("dead", "boom 3", 3)
    assert status["inflight_items"] == 1
    assert lanes.counts() == {"queued": 0, "running": 0, "dead": 1}
    assert redis_client.exists(keys.lease("ava")) == 0


def test_fail_with_a_stale_fence_raises_lease_lost(
    lanes: Lanes, redis_client: redis.Redis, key_prefix: str
) -> None:
    """fail is fencing-checked like finish."""
    started = lanes.start("ava", _queued_turn(lanes), "w1")
    before = dump_keys(redis_client, key_prefix)
    with pytest.raises(LeaseLost):
        lanes.fail("ava", started.fence + 1, error="not mine")
    assert dump_keys(redis_client, key_prefix) == before


def test_a_crash_loop_dead_letters_after_max_attempts(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """start, crash, redeliver... the (max_attempts + 1)th start dead-letters the lane."""
    turn = _queued_turn(lanes)
    for attempt in (1, 2, 3):
        started = lanes.start("ava", turn, "w")
        assert (started.status, started.attempt) == ("started", attempt)
        _crash(redis_client, keys)
    final = lanes.start("ava", turn, "w")
    assert final.status == "dead"
    assert final.error == "worker lost mid-turn 3 times"
    status = lanes.status("ava")
    assert (status["state"], status["last_error"]) == ("dead", "worker lost mid-turn 3 times")
    assert lanes.counts() == {"queued": 0, "running": 0, "dead": 1}
    assert lanes.start("ava", turn, "w").status == "dead"


def test_dead_letter_after_mixed_failures_and_crashes_names_both(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """When some attempts failed and the last ones crashed, the error keeps the real error."""
    started = lanes.start("ava", _queued_turn(lanes), "w")
    turn = lanes.fail("ava", started.fence, error="model said no").retry_turn_id
    assert turn is not None
    for _ in (2, 3):
        lanes.start("ava", turn, "w")
        _crash(redis_client, keys)
    final = lanes.start("ava", turn, "w")
    assert final.error == "worker lost mid-turn 2 times (last error: model said no)"


def test_revive_requeues_a_dead_lane_with_its_kept_items_first(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys
) -> None:
    """revive resets attempts and queues a new turn that runs the dead turn's items alone
    (a message the provider refuses for good then dies alone: `--drop-kept` drops only it);
    what was posted meanwhile is the turn after it."""
    kept, later = item("kept"), item("later")
    turn = lanes.post("ava", kept, wake=True).turn_id
    for _ in range(3):
        assert turn is not None
        started = lanes.start("ava", turn, "w")
        turn = lanes.fail("ava", started.fence, error="boom").retry_turn_id
    lanes.post("ava", later, wake=True)
    revived = lanes.revive("ava")
    assert (revived.outcome, revived.turn_kind) == ("queued", "interactive")
    assert revived.turn_id is not None
    assert lanes.counts() == {"queued": 1, "running": 0, "dead": 0}
    again = lanes.start("ava", revived.turn_id, "w")
    assert (again.status, again.attempt) == ("started", 1)
    assert [i.id for i in again.items] == [kept.id]
    done = lanes.finish("ava", again.fence, status="done", text="ok")
    assert done.follow_up_turn_id is not None
    follow = lanes.start("ava", done.follow_up_turn_id, "w")
    assert [i.id for i in follow.items] == [later.id]


def test_a_poison_item_dies_alone_so_drop_kept_spares_what_was_posted_since(
    lanes: Lanes,
) -> None:
    """A message the provider refuses for good dead-letters its lane; a plain revive ran it
    with the posts that came meanwhile, died again, and `--drop-kept` then dropped those
    innocent posts with it (their senders never answered). The revived turn runs the poison
    alone: dropping it leaves the later post to run."""
    poison, later = item("POISON"), item("please ack")
    turn = lanes.post("ava", poison, wake=True).turn_id
    assert turn is not None
    started = lanes.start("ava", turn, "w")
    lanes.fail("ava", started.fence, error="HTTP 400", kind="permanent")
    lanes.post("ava", later, wake=True)
    revived = lanes.revive("ava")
    assert revived.turn_id is not None
    again = lanes.start("ava", revived.turn_id, "w")
    assert [i.id for i in again.items] == [poison.id]
    lanes.fail("ava", again.fence, error="HTTP 400", kind="permanent")
    dropped = lanes.revive("ava", drop_kept=True)
    assert dropped.turn_id is not None
    assert lanes.status("ava")["inbox_depth"] == 1
    last = lanes.start("ava", dropped.turn_id, "w")
    assert [i.id for i in last.items] == [later.id]


def test_drop_kept_of_a_heartbeat_a_post_joined_runs_the_heartbeat_as_a_heartbeat(
    lanes: Lanes,
) -> None:
    """A post joined a heartbeat's turn (a conversation then: its model and budget rules) and
    the turn died on the post; `--drop-kept` drops the post, and the turn left answers the
    heartbeat's ticks under the heartbeat's kind, not the conversation's."""
    turn = lanes.tick("ava", kind="heartbeat").turn_id
    assert turn is not None
    poison = item("POISON")
    lanes.post("ava", poison, wake=False)
    started = lanes.start("ava", turn, "w")
    assert (started.kind, started.ticks, [i.id for i in started.items]) == (
        "interactive", 1, [poison.id])  # fmt: skip
    lanes.fail("ava", started.fence, error="HTTP 400", kind="permanent")
    revived = lanes.revive("ava", drop_kept=True)
    assert (revived.outcome, revived.turn_kind, revived.dropped) == ("queued", "heartbeat", 1)
    assert revived.turn_id is not None
    again = lanes.start("ava", revived.turn_id, "w")
    assert (again.kind, again.ticks, again.items) == ("heartbeat", 1, [])


def test_a_plain_revive_of_that_turn_keeps_it_a_conversation(lanes: Lanes) -> None:
    """Without `--drop-kept` the post still runs with the ticks: the conversation's kind."""
    turn = lanes.tick("ava", kind="heartbeat").turn_id
    assert turn is not None
    lanes.post("ava", item("hello"), wake=False)
    started = lanes.start("ava", turn, "w")
    lanes.fail("ava", started.fence, error="HTTP 400", kind="permanent")
    revived = lanes.revive("ava")
    assert (revived.outcome, revived.turn_kind) == ("queued", "interactive")


def test_revive_of_a_live_lane_changes_nothing(
    lanes: Lanes, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Reviving a lane that is not dead is a no-op with no turn to publish."""
    _queued_turn(lanes)
    before = dump_keys(redis_client, key_prefix)
    outcome = lanes.revive("ava")
    assert (outcome.outcome, outcome.turn_id) == ("coalesced", None)
    assert dump_keys(redis_client, key_prefix) == before


# -- reap ---------------------------------------------------------------------------------------
def test_reap_requeues_a_running_lane_whose_lease_expired_and_fences_out_the_old_holder(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, clock: VirtualClock
) -> None:
    """Lease gone + expiry passed: new turn id, fence bumped, the old holder cannot finish."""
    a = item("a")
    turn = lanes.post("ava", a, wake=True).turn_id
    assert turn is not None
    old = lanes.start("ava", turn, "w1")
    _crash(redis_client, keys)
    clock.advance(31)
    (repair,) = lanes.reap(queued_after=600)
    assert (repair.lane, repair.reason, repair.kind) == ("ava", "lease_expired", "interactive")
    assert repair.turn_id != turn
    assert lanes.status("ava")["fence"] == old.fence + 1
    with pytest.raises(LeaseLost):
        lanes.finish("ava", old.fence, status="done", text="late")
    assert not lanes.renew("ava", old.fence)
    assert lanes.start("ava", turn, "w2").status == "stale"
    fresh = lanes.start("ava", repair.turn_id, "w2")
    assert ([i.id for i in fresh.items], fresh.recovered) == ([a.id], 1)


def test_one_lane_with_broken_keys_never_stops_the_repair_of_the_others(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, clock: VirtualClock
) -> None:
    """A stranded lane whose hash is not a hash (a hand edit, a bug) fails ITS repair (logged
    lane.reap_failed); the other stranded lanes of the same pass are repaired."""
    for lane in ("ava", "bob"):
        turn = lanes.post(lane, item("a"), wake=True).turn_id
        assert turn is not None
        lanes.start(lane, turn, "w1")
        _crash(redis_client, keys, lane)
    redis_client.delete(keys.lane("ava"))
    redis_client.set(keys.lane("ava"), "not a hash")
    clock.advance(31)
    repairs = lanes.reap(queued_after=600)
    assert [(r.lane, r.reason) for r in repairs] == [("bob", "lease_expired")]
    assert lanes.status("bob")["state"] == "queued"


def test_reap_leaves_a_live_lease_and_an_unexpired_one_alone(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, clock: VirtualClock, key_prefix: str
) -> None:
    """A lease key that is alive, or an expiry not yet passed, is never reaped."""
    lanes.start("ava", _queued_turn(lanes, "ava"), "w1")
    lanes.start("bob", _queued_turn(lanes, "bob"), "w1")
    _crash(redis_client, keys, "bob")
    clock.advance(29)
    assert lanes.reap(queued_after=600) == []
    clock.advance(2)
    assert [r.lane for r in lanes.reap(queued_after=600)] == ["bob"]


def test_reap_republishes_a_turn_queued_too_long_with_the_same_turn_id(
    lanes: Lanes, clock: VirtualClock
) -> None:
    """A lost turn message is re-sent with the SAME id, once per queued_after."""
    turn = _queued_turn(lanes)
    clock.advance(59)
    assert lanes.reap(queued_after=60) == []
    clock.advance(2)
    (repair,) = lanes.reap(queued_after=60)
    assert (repair.reason, repair.turn_id, repair.kind) == ("queued_too_long", turn, "interactive")
    assert lanes.status("ava")["queued_at"] == 1_700_000_061.0
    assert lanes.reap(queued_after=60) == []
    assert lanes.start("ava", turn, "w").status == "started"


def test_reap_heals_index_entries_of_lanes_that_moved_on(
    lanes: Lanes, redis_client: redis.Redis, keys: Keys, clock: VirtualClock
) -> None:
    """A stale lanes:running / lanes:queued member for an idle lane is dropped, not repaired."""
    redis_client.zadd(keys.running, {"ghost": 1})
    redis_client.zadd(keys.queued, {"ghost2": 1})
    assert lanes.reap(queued_after=1) == []
    assert lanes.counts() == {"queued": 0, "running": 0, "dead": 0}


# -- status / counts / errors -------------------------------------------------------------------
def test_status_of_an_unknown_lane_is_idle_and_empty(lanes: Lanes) -> None:
    """A lane with no hash is idle with nothing pending."""
    status = lanes.status("nobody")
    assert status["state"] == "idle"
    assert (status["pending_ticks"], status["inbox_depth"], status["inflight_items"]) == (0, 0, 0)
    assert status["last_turn"] is None


def test_redis_down_raises_redis_unavailable_without_the_password() -> None:
    """A connection failure becomes RedisUnavailable; the message hides the password."""
    port = free_port()
    client = redis.Redis.from_url(
        f"redis://:hunter2@127.0.0.1:{port}/0", decode_responses=True, socket_connect_timeout=1
    )
    lanes = make_lanes(client, "x:")
    with pytest.raises(RedisUnavailable) as caught:
        lanes.post("ava", item("hi"), wake=True)
    message = str(caught.value)
    assert "hunter2" not in message
    assert f"127.0.0.1:{port}" in message
    assert "soulfleet up" in message
    with pytest.raises(RedisUnavailable):
        lanes.tick_many([("ava", "heartbeat")])


def test_lanes_refuses_a_client_that_returns_bytes(redis_url: str) -> None:
    """Lanes needs decode_responses=True; a bytes client is refused up front."""
    with pytest.raises(ValueError, match="decode_responses"):
        make_lanes(redis.Redis.from_url(redis_url), "x:")


def test_a_retry_waits_at_least_what_the_provider_asked(lanes: Lanes, clock: VirtualClock) -> None:
    """A transient failure whose provider asked to be left alone for 40 s: the retry is
    scheduled no sooner, whatever the (here at most 0.5 s) backoff drew; without such a wait
    the backoff alone decides."""
    started = lanes.start("ava", _queued_turn(lanes), "w1")
    failed = lanes.fail(
        "ava", started.fence, error="rate limited", kind="transient",
        backoff=(0.2, 0.5), jitter=0.5, wait_at_least=40.0,
    )  # fmt: skip
    assert failed.retry_at == clock.time() + 40.0
    started = lanes.start("bob", _queued_turn(lanes, "bob"), "w1")
    failed = lanes.fail(
        "bob", started.fence, error="server error", kind="transient",
        backoff=(0.2, 0.5), jitter=0.5,
    )  # fmt: skip
    assert failed.retry_at == clock.time() + 0.1


def test_a_start_carries_the_error_of_a_failing_lane_and_not_of_a_recovered_one(
    lanes: Lanes,
) -> None:
    """A lane failing since its last success hands its last try's error to the next start
    (a turn after a storage failure probes its disk before paying for a call); once a turn
    has succeeded, the start's error is empty again though last_error keeps the old one."""
    started = lanes.start("ava", _queued_turn(lanes), "w1")
    assert started.error == ""
    retry = lanes.fail("ava", started.fence, error="persona storage unavailable at /p/ava: x")
    assert retry.retry_turn_id is not None
    again = lanes.start("ava", retry.retry_turn_id, "w1")
    assert again.error == "persona storage unavailable at /p/ava: x"
    lanes.finish("ava", again.fence, status="done", text="ok")
    later = lanes.start("ava", _queued_turn(lanes), "w1")
    assert later.error == ""
    assert lanes.status("ava")["last_error"] == "persona storage unavailable at /p/ava: x"
