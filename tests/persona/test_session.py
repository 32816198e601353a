"""Sessions in the persona core (issue 11): the library's ``run(session=...)`` and the
in-process heartbeat driver remember the conversation, freeze the soul per session, keep
silent beats out, end sessions by idle/daily/explicit reset on a virtual clock, and compact.

Real persona directories and real files; only the model is a fake (it answers from the
messages it is given, so remembering is observable in its answers).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.turns import Call, ReplayModel, make_persona, says
from workers.persona.clock import VirtualClock
from workers.persona.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX, Compaction
from workers.persona.driver import start_agent
from workers.persona.errors import ModelServerError, PersonaConfigError
from workers.persona.loop import Budget, RunResult
from workers.persona.manifest import load_manifest
from workers.persona.messages import Completion, Usage
from workers.persona.runner import run
from workers.persona.search import transcript_search_tool
from workers.persona.session import COMPACTION_FAILED, Pointer, SessionState, next_session_id
from workers.persona.session_files import current_session
from workers.persona.session_plan import SessionPlan
from workers.persona.transcripts import FileTranscripts

# 2023-11-14 22:13:20 UTC
START = 1_700_000_000.0


def recall(seen: Call) -> Completion:
    """A model that answers from history: the latest 'my name is X' it was told, if any."""
    names = [
        match.group(1)
        for message in seen.messages
        if message.role == "user"
        for match in re.finditer(r"my name is (\w+)", message.content)
    ]
    last = seen.messages[-1].content
    if "what is my name" in last:
        return says(names[-1] if names else "I don't know", tokens=10)
    if "Heartbeat" in last:
        return says("HEARTBEAT_OK")
    return says(f"noted: {last[:40]}", tokens=10)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_persona(tmp_path)


def test_second_turn_sees_the_first_exchange(home: Path) -> None:
    """Continuity: the second run's request carries the first exchange, and a model that
    answers from history says "Bob"."""
    model = ReplayModel(recall)
    clock = VirtualClock(START)
    run(home, "my name is Bob", model, session=True, clock=clock)
    clock.advance(60)
    second = run(home, "what is my name?", model, session=True, clock=clock)
    assert second.text == "Bob"
    sent = [(m.role, m.content) for m in model.calls[1].messages]
    assert sent == [("user", "my name is Bob"), ("assistant", "noted: my name is Bob"),
                    ("user", "what is my name?")]  # fmt: skip
    state = current_session(home, "ava")
    assert state is not None
    assert state.turns == 2
    assert len(state.messages) == 4


def test_one_shot_runs_remember_nothing(home: Path) -> None:
    """session=False (the default) is today's behaviour: no history, no session stored."""
    model = ReplayModel(recall)
    run(home, "my name is Bob", model)
    assert run(home, "what is my name?", model).text == "I don't know"
    assert len(model.calls[1].messages) == 1
    assert current_session(home, "ava") is None


def test_the_soul_is_frozen_for_the_session(home: Path) -> None:
    """MEMORY.md edited between two turns: both requests carry byte-identical system prompts;
    a new session ("new") composes afresh and carries the edit."""
    model = ReplayModel(recall)
    run(home, "hello", model, session=True)
    (home / "MEMORY.md").write_text("- Sam moved to Oslo.", encoding="utf-8")
    (home / "SOUL.md").write_text("I am someone else now.", encoding="utf-8")
    run(home, "again", model, session=True)
    assert model.calls[0].system.encode() == model.calls[1].system.encode()
    assert "Oslo" not in model.calls[1].system
    run(home, "fresh start", model, session="new")
    assert "Sam moved to Oslo." in model.calls[2].system
    assert [m.content for m in model.calls[2].messages] == ["fresh start"]


def test_a_session_whose_frozen_soul_is_over_its_budget_is_not_continued(home: Path) -> None:
    """A soul frozen while MEMORY.md was huge (alone over session.max_tokens) would end every
    later turn before its model call, even after MEMORY.md is trimmed, until someone reset the
    session: the next turn starts a new session that reads the files as they are now."""
    (home / "persona.toml").write_text("[session]\nmax_tokens = 2000\nkeep_tail = 500\n")
    (home / "MEMORY.md").write_text("- a fact worth keeping\n" * 600, encoding="utf-8")
    model = ReplayModel(recall)
    run(home, "my name is Bob", model, session=True)
    (home / "MEMORY.md").write_text("- trimmed\n", encoding="utf-8")
    run(home, "hello again", model, session=True)
    assert "a fact worth keeping" in model.calls[0].system
    assert "a fact worth keeping" not in model.calls[1].system
    assert "- trimmed" in model.calls[1].system
    assert [m.content for m in model.calls[1].messages] == ["hello again"]
    (home / "MEMORY.md").write_text("- trimmed again\n", encoding="utf-8")
    run(home, "and again", model, session=True)  # a soul within budget stays frozen
    assert model.calls[2].system == model.calls[1].system


def test_a_frozen_soul_over_the_turn_budget_is_not_continued_either(home: Path) -> None:
    """session.max_tokens at its default, the turn budget smaller than the soul: the first turn
    ends before its model call (input over budget) and its session keeps that soul; after
    MEMORY.md is trimmed the next turn must read the files anew, not end the same way again."""
    (home / "MEMORY.md").write_text("- a fact worth keeping\n" * 600, encoding="utf-8")
    model = ReplayModel(recall)
    budget = Budget(max_tokens=3000)
    first = run(home, "my name is Bob", model, budget, session=True)
    assert (first.status, first.limit, len(model.calls)) == ("incomplete", "max_tokens", 0)
    (home / "MEMORY.md").write_text("- trimmed\n", encoding="utf-8")
    second = run(home, "hello again", model, budget, session=True)
    assert second.status == "done"
    assert "- trimmed" in model.calls[0].system


def test_idle_reset_on_a_virtual_clock(home: Path) -> None:
    """A turn within idle_reset of the last one continues; after it, a new session starts."""
    (home / "persona.toml").write_text('[session]\nidle_reset = "1h"\n', encoding="utf-8")
    model = ReplayModel(recall)
    clock = VirtualClock(START)
    run(home, "my name is Bob", model, session=True, clock=clock)
    clock.advance(3599)
    assert run(home, "what is my name?", model, session=True, clock=clock).text == "Bob"
    first = current_session(home, "ava")
    clock.advance(3600)
    assert run(home, "what is my name?", model, session=True, clock=clock).text == "I don't know"
    second = current_session(home, "ava")
    assert first is not None
    assert second is not None
    assert second.id != first.id
    assert second.turns == 1
    assert second.started_at == clock.time()


def test_daily_reset_in_its_time_zone(home: Path) -> None:
    """daily_reset = "04:00" in Europe/Berlin: a turn at 03:59 and one at 04:01 local are two
    sessions although only two minutes apart; two turns after 04:00 share one."""
    (home / "persona.toml").write_text(
        '[session]\ndaily_reset = "04:00"\ntimezone = "Europe/Berlin"\n', encoding="utf-8"
    )
    model = ReplayModel(recall)
    # 2023-11-15 02:59 UTC = 03:59 in Berlin (CET, UTC+1)
    clock = VirtualClock(1_700_017_140.0)
    run(home, "my name is Bob", model, session=True, clock=clock)
    clock.advance(120)
    assert run(home, "what is my name?", model, session=True, clock=clock).text == "I don't know"
    run(home, "my name is Ann", model, session=True, clock=clock)
    clock.advance(3600)
    assert run(home, "what is my name?", model, session=True, clock=clock).text == "Ann"


def test_zero_idle_reset_is_one_conversation_per_turn(home: Path) -> None:
    """idle_reset = "0s": every turn is its own session and its own transcript conversation,
    with no history (today's behaviour)."""
    (home / "persona.toml").write_text('[session]\nidle_reset = "0s"\n', encoding="utf-8")
    model = ReplayModel(recall)
    for text in ("my name is Bob", "what is my name?", "what is my name?"):
        run(home, text, model, session=True)
    assert [len(call.messages) for call in model.calls] == [1, 1, 1]
    assert model.calls[1].messages[0].content == "what is my name?"
    assert len(FileTranscripts(home).conversations()) == 3


def test_a_failed_turn_adds_nothing(home: Path) -> None:
    """A turn whose model call fails leaves the session as it was; the next turn continues."""
    model = ReplayModel(recall, ModelServerError("boom"), recall)
    run(home, "my name is Bob", model, session=True)
    failed = run(home, "lost words", model, session=True)
    assert failed.status == "error"
    state = current_session(home, "ava")
    assert state is not None
    assert state.turns == 1
    assert run(home, "what is my name?", model, session=True).text == "Bob"
    assert "lost words" not in [m.content for m in model.calls[2].messages]


def test_fifty_silent_beats_add_nothing_and_a_surfaced_beat_is_kept(tmp_path: Path) -> None:
    """The driver: 50 HEARTBEAT_OK beats between two user turns add 0 messages to the session
    (they are still in the transcript, in the same conversation); a surfaced beat is appended
    so the next user turn sees what the persona said."""
    home = make_persona(tmp_path)
    clock = VirtualClock(START)
    replies = iter(["HEARTBEAT_OK"] * 50 + ["Reminder: water the plants"])

    def model_fn(seen: Call) -> Completion:
        if "Heartbeat" in seen.messages[-1].content:
            return says(next(replies))
        return recall(seen)

    model = ReplayModel(model_fn)
    driver = start_agent(home, every=60, clock=clock, model=model)
    driver.post("my name is Bob", "sam", "chat", wake=True)
    before = current_session(home, "ava")
    assert before is not None
    assert len(before.messages) == 2
    clock.advance(50 * 60)
    assert driver.turns == 51
    after_silence = current_session(home, "ava")
    assert after_silence == before
    transcripts = FileTranscripts(home).conversations()
    assert len(transcripts) == 1
    assert len(FileTranscripts(home).messages(transcripts[0].id)) == 2 + 50 * 2
    clock.advance(60)  # the 51st beat surfaces
    assert driver.beats == ["Reminder: water the plants"]
    driver.post("what do you mean? what is my name?", "sam", "chat", wake=True)
    driver.stop()
    last = model.calls[-1].messages
    said = [m.content for m in last if m.role == "assistant"]
    assert len(said) == 2
    assert said[0].startswith("noted: ")
    assert said[1] == "Reminder: water the plants"
    assert driver.last_result is not None
    assert driver.last_result.text == "Bob"


def test_retention_counts_sessions_not_turns(tmp_path: Path) -> None:
    """Transcripts are one file per session: many turns and silent beats in one session make
    one file, and the bound (max_conversations) drops whole old sessions."""
    home = make_persona(tmp_path)
    model = ReplayModel(recall)
    clock = VirtualClock(START)
    for _ in range(30):
        run(home, "hello", model, session=True, clock=clock)
        clock.advance(60)
    assert len(FileTranscripts(home).conversations()) == 1
    for _ in range(5):
        run(home, "again", model, session="new", clock=clock)
    assert len(FileTranscripts(home).conversations()) == 6


def test_compaction_through_run_counts_the_summary_call(home: Path) -> None:
    """Over max_tokens, the turn first asks the persona's own model for a summary (counted in
    usage and model_calls), sends [summary, tail, new message] under the SAME system prompt,
    and the session records the compaction."""
    (home / "persona.toml").write_text(
        "[session]\nmax_tokens = 400\nkeep_tail = 100\n", encoding="utf-8"
    )

    def answer(seen: Call) -> Completion:
        if seen.system == SUMMARY_INSTRUCTIONS:
            return Completion(text="Bob chatted a lot.", usage=Usage(1000, 20))
        return says("ok " * 40, tokens=5)

    model = ReplayModel(answer)
    for n in range(6):
        result = run(home, f"message {n} " + "blah " * 30, model, session=True)
    summaries = [c for c in model.calls if c.system == SUMMARY_INSTRUCTIONS]
    assert len(summaries) >= 1
    state = current_session(home, "ava")
    assert state is not None
    assert state.compactions == len(summaries)
    assert state.messages[0].content.startswith(SUMMARY_PREFIX)
    persona_systems = {c.system for c in model.calls if c.system != SUMMARY_INSTRUCTIONS}
    assert len(persona_systems) == 1
    # the last turn compacted? then its usage includes the summary call
    if model.calls[-2].system == SUMMARY_INSTRUCTIONS:
        assert result.model_calls == 2
        assert result.usage.input_tokens >= 1000


def test_an_empty_summary_loses_no_history_and_is_charged(home: Path) -> None:
    """A summary call that comes back empty leaves the conversation whole: the next turn still
    sees the first message, the session records no compaction, and the turn that paid for the
    empty summary counts it (usage and model_calls)."""
    (home / "persona.toml").write_text(
        "[session]\nmax_tokens = 400\nkeep_tail = 100\n", encoding="utf-8"
    )

    def answer(seen: Call) -> Completion:
        if seen.system == SUMMARY_INSTRUCTIONS:
            return Completion(text="", usage=Usage(1000, 0), stop_reason="length")
        return recall(seen)

    model = ReplayModel(answer)
    run(home, "my name is Zed " + "blah " * 80, model, session=True)
    results = [run(home, f"message {n} " + "blah " * 80, model, session=True) for n in range(4)]
    assert any(c.system == SUMMARY_INSTRUCTIONS for c in model.calls)
    charged = [r for r in results if r.model_calls == 2]
    assert charged
    assert all(r.usage.input_tokens >= 1000 for r in charged)
    state = current_session(home, "ava")
    assert state is not None
    assert state.compactions == 0
    assert not any(m.content.startswith(SUMMARY_PREFIX) for m in state.messages)
    assert run(home, "what is my name?", model, session=True).text == "Zed"


def test_a_failed_summary_is_kept_in_the_session_until_one_succeeds(home: Path) -> None:
    """A summary call the provider refuses leaves the history whole and the turn goes on (no
    model call counted for it); the session's state keeps when and why, what `session show`
    tells, and the failure the next one replaces (an empty answer says it came back empty)
    is gone once a summary succeeds."""
    (home / "persona.toml").write_text(
        "[session]\nmax_tokens = 400\nkeep_tail = 100\n", encoding="utf-8"
    )
    summaries: list[Completion | Exception] = [
        ModelServerError("HTTP 503 from the summary call"),
        ModelServerError("HTTP 503 from the summary call"),
        Completion(text="", usage=Usage(10, 0), stop_reason="stop"),
        Completion(text="Zed chatted.", usage=Usage(10, 5)),
    ]

    def answer(seen: Call) -> Completion:
        if seen.system == SUMMARY_INSTRUCTIONS:
            outcome = summaries.pop(0) if len(summaries) > 1 else summaries[0]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return recall(seen)

    model = ReplayModel(answer)
    asked = 0

    def until_a_summary_is_asked(n: int) -> RunResult:
        nonlocal asked
        for _ in range(10):
            result = run(home, f"message {n} " + "blah " * 80, model, session=True)
            if sum(c.system == SUMMARY_INSTRUCTIONS for c in model.calls) > asked:
                asked += 1
                return result
        raise AssertionError("no summary asked in 10 turns")

    run(home, "my name is Zed " + "blah " * 80, model, session=True)
    failed = until_a_summary_is_asked(1)
    assert failed.status == "done"
    assert failed.model_calls == 1  # the call that raised is not counted
    state = current_session(home, "ava")
    assert state is not None
    assert state.compactions == 0
    first = state.summary()["compaction_failed"]
    assert first["error"] == "ModelServerError: HTTP 503 from the summary call"
    assert first["at"] > 0
    time.sleep(0.01)
    until_a_summary_is_asked(2)  # the same failure again: "failing since" its first time
    state = current_session(home, "ava")
    assert state is not None
    assert state.summary()["compaction_failed"] == first
    until_a_summary_is_asked(3)
    state = current_session(home, "ava")
    assert state is not None
    assert state.summary()["compaction_failed"]["error"] == "the summary came back empty"
    until_a_summary_is_asked(4)
    state = current_session(home, "ava")
    assert state is not None
    assert state.compactions == 1
    assert state.summary()["compaction_failed"] is None


def test_a_failure_ends_when_the_session_is_no_longer_over_its_budget(home: Path) -> None:
    """A summary that failed, then `session.max_tokens` raised: the next turn needs no
    compaction, and the failure (which said the session grows past its budget and each turn
    tries again) is gone from the state."""
    (home / "persona.toml").write_text(
        "[session]\nmax_tokens = 400\nkeep_tail = 100\n", encoding="utf-8"
    )

    def answer(seen: Call) -> Completion:
        if seen.system == SUMMARY_INSTRUCTIONS:
            raise ModelServerError("HTTP 503 from the summary call")
        return recall(seen)

    model = ReplayModel(answer)
    for n in range(10):
        run(home, f"message {n} " + "blah " * 80, model, session=True)
        state = current_session(home, "ava")
        if state is not None and state.summary()["compaction_failed"] is not None:
            break
    else:
        raise AssertionError("no failed compaction in 10 turns")
    (home / "persona.toml").write_text("[session]\nmax_tokens = 100000\n", encoding="utf-8")
    run(home, "and now?", model, session=True)
    state = current_session(home, "ava")
    assert state is not None
    assert state.summary()["compaction_failed"] is None


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('idle_reset = "4 hours"', "session.idle_reset"),
        # Past the 3650d cap, and counts whose int() overflows a float (400 digits) or that
        # int() refuses (5,000): an OverflowError/ValueError crashed the whole fleet's status.
        ('idle_reset = "99999d"', "session.idle_reset"),
        (f'idle_reset = "{"9" * 400}s"', "session.idle_reset"),
        (f'idle_reset = "{"9" * 5000}s"', "session.idle_reset"),
        ('daily_reset = "4am"', "session.daily_reset"),
        ('timezone = "Mars/Base"', "session.timezone"),
        ("max_tokens = -1", "session.max_tokens"),
        ("keep_tail = 90000", "session.keep_tail"),
        ('flush_to_memory = "yes"', "session.flush_to_memory"),
        ("idel_reset = 1", "session.idel_reset"),
    ],
)
def test_bad_session_keys_name_the_key_and_file(home: Path, table: str, key: str) -> None:
    """Unknown keys and bad values in [session] fail naming the dotted key and the file."""
    (home / "persona.toml").write_text(f"[session]\n{table}\n", encoding="utf-8")
    with pytest.raises(PersonaConfigError) as raised:
        load_manifest(home)
    assert raised.value.key == key
    assert "persona.toml" in str(raised.value)


def test_session_defaults(home: Path) -> None:
    """No [session]: 4h idle reset, no daily reset, 60000 tokens, tail half of that."""
    config = load_manifest(home).session
    assert (config.idle_reset, config.daily_reset, config.max_tokens) == (14400, None, 60000)
    assert config.tail_tokens == 30000
    assert config.flush_to_memory is False


def test_transcript_search_finds_a_sessions_turns_as_one_conversation(home: Path) -> None:
    """The dreamer's transcript_search searches sessions: hits from two turns of one session
    name the same conversation, the session's id."""
    model = ReplayModel(recall)
    run(home, "my name is Bob and I like tea", model, session=True)
    run(home, "tea again, please", model, session=True)
    state = current_session(home, "ava")
    assert state is not None
    tool = transcript_search_tool(FileTranscripts(home, lanes=["ava"]))
    found = tool.execute({"query": "tea"}).output.splitlines()[1:]
    assert len(found) == 4  # both user messages and both (echoing) replies
    assert all(f"conversation={state.id} " in line for line in found)


def test_silent_beats_after_a_session_ended_share_one_transcript(tmp_path: Path) -> None:
    """Beats every 2h on a 1h idle_reset find the session over each time: silent ones start no
    session and all land in ONE transcript (the next session's), which the next user turn then
    continues; so 20 silent beats cannot push a conversation out of retention."""
    home = make_persona(tmp_path, manifest='[session]\nidle_reset = "1h"\n')
    clock = VirtualClock(START)
    model = ReplayModel(recall)
    driver = start_agent(home, every=7200, clock=clock, model=model)
    driver.post("my name is Bob", "sam", "chat", wake=True)
    first = current_session(home, "ava")
    assert first is not None
    clock.advance(20 * 7200)
    assert driver.turns == 21
    assert current_session(home, "ava") == first
    assert len(FileTranscripts(home).conversations()) == 2
    driver.post("what is my name?", "sam", "chat", wake=True)
    driver.stop()
    second = current_session(home, "ava")
    assert second is not None
    assert second.id == next_session_id(first.id)
    assert second.turns == 1
    assert driver.last_result is not None
    assert driver.last_result.text == "I don't know"
    assert len(FileTranscripts(home).conversations()) == 2


def test_a_silent_beat_writes_a_failure_only_when_it_starts_or_ends() -> None:
    """Silent beats commit nothing; one whose compaction failed commits the failure, and the
    next silent beats of that over-budget session, failing again (each error worded its own
    way: a time left, a response excerpt), commit nothing (each wrote and synced the whole
    state). A beat under budget again ends it; a turn's failure keeps "failing since"."""
    base = SessionState(id="s", lane="ava", epoch=0, started_at=1.0, last_turn_at=1.0, soul="x")
    failing = Compaction((), Usage(), 0, 0, 10, 10, applied=False, failed="HTTP 503", raised=True)
    plan = SessionPlan(
        lane="ava", session_id="s", soul="x", sections=(), history=(), pointer=Pointer("s", 0),
        base=base, started_at=1.0, new=False, reason="continued", compaction=failing,
        planned_at=50.0,
    )  # fmt: skip
    first = plan.conclude([], silent_beat=True)
    assert first is not None
    assert first.extra[COMPACTION_FAILED] == {"at": 50.0, "error": "HTTP 503"}
    assert first.messages == base.messages
    again = replace(plan, base=first, planned_at=60.0)
    assert again.conclude([], silent_beat=True) is None
    other = replace(again, compaction=replace(failing, failed="TurnTimeUp: within the 3.1s"))
    assert other.conclude([], silent_beat=True) is None
    talked = other.conclude([], silent_beat=False)  # a turn that said something: written
    assert talked is not None
    assert talked.extra[COMPACTION_FAILED] == {"at": 50.0, "error": "TurnTimeUp: within the 3.1s"}
    skipped = replace(again, compaction=None)  # over budget still, compaction skipped
    assert skipped.conclude([], silent_beat=True) is None
    under = replace(again, compaction=None, under_budget=True)
    ended = under.conclude([], silent_beat=True)
    assert ended is not None
    assert COMPACTION_FAILED not in ended.extra
