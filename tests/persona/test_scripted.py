"""Tests for workers/persona/models/scripted.py: rule matching, substitutions, sleep and usage,
and the built-in script (the file format's errors are in test_rules.py)."""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from typing import Any

import pytest

from workers.persona.clock import VirtualClock
from workers.persona.errors import TurnTimeUp
from workers.persona.heartbeat import HEARTBEAT_OK, HEARTBEAT_PROMPT
from workers.persona.inbox import InboxItem, render_inbox
from workers.persona.messages import Completion, Message, ToolSpec
from workers.persona.models import Model
from workers.persona.models.scripted import (
    BUILTIN_SPEC,
    FALLBACK_TEXT,
    ScriptedModel,
    sections_of,
)
from workers.persona.turn_time import turn_deadline

SOUL = (
    "## SOUL.md\n\nI am Ava.\n\n## HEARTBEAT.md\n\n- check the mail\n\n## MEMORY.md\n\n- likes tea"
)
MEMORY = ToolSpec("memory", "memory tool", {"type": "object"})
SEARCH = ToolSpec("transcript_search", "search", {"type": "object"})


def user(text: str) -> Message:
    return Message(role="user", content=text)


def tool(text: str, *, is_error: bool = False, call_id: str = "c1") -> Message:
    return Message(
        role="tool", content=text, tool_call_id=call_id, name="memory", is_error=is_error
    )


def ask(
    model: ScriptedModel,
    messages: Sequence[Message],
    *,
    system: str = SOUL,
    tools: Sequence[ToolSpec] = (MEMORY,),
) -> Completion:
    return model.complete(system=system, messages=messages, tools=tools)


def model_of(*rules: dict[str, Any]) -> ScriptedModel:
    return ScriptedModel.from_rules({"rules": list(rules)})


# --- what the rules can express (the four the issue names) -------------------------------------


def test_echoes_the_section_names_in_prompt_order() -> None:
    """{sections} lists the "## <file>" sections of the system prompt, comma-separated."""
    model = model_of({"text": "sections: {sections}"})
    assert ask(model, [user("hi")]).text == "sections: SOUL.md, HEARTBEAT.md, MEMORY.md"


def test_calls_memory_add_then_reports_the_tool_answer() -> None:
    """A two-rule script calls memory add with the captured text, then reports the result."""
    model = model_of(
        {
            "when": {"user_regex": r"remember: (.+)", "tool_results": 0},
            "calls": [{"tool": "memory", "args": {"action": "add", "text": "{match}"}}],
        },
        {"when": {"tool_results": 1}, "text": "Noted. {tool_result}"},
    )
    first = ask(model, [user("remember: the cat is Tom")])
    assert first.text == ""
    assert [(c.name, dict(c.arguments)) for c in first.tool_calls] == [
        ("memory", {"action": "add", "text": "the cat is Tom"})
    ]
    history = [user("remember: the cat is Tom"), first.as_message(), tool("added to MEMORY.md")]
    second = ask(model, history)
    assert second.text == "Noted. added to MEMORY.md"
    assert second.tool_calls == ()


def test_answers_differently_when_the_system_prompt_contains_a_phrase() -> None:
    """system_contains picks the rule by what the soul says."""
    model = model_of(
        {"when": {"system_contains": "I am Ava."}, "text": "Ava here"},
        {"text": "someone else"},
    )
    assert ask(model, [user("hi")]).text == "Ava here"
    assert ask(model, [user("hi")], system="## SOUL.md\n\nI am Bo.").text == "someone else"


def test_heartbeat_ok_unless_heartbeat_md_says_something_is_due() -> None:
    """A section_regex on HEARTBEAT.md surfaces a due item; otherwise HEARTBEAT_OK."""
    model = model_of(
        {
            "when": {"heartbeat": True, "section": "HEARTBEAT.md", "section_regex": r"due: (.+)"},
            "text": "Reminder: {match}",
        },
        {"when": {"heartbeat": True}, "text": "HEARTBEAT_OK"},
    )
    due = "## HEARTBEAT.md\n\ndue: water the plants"
    assert ask(model, [user(HEARTBEAT_PROMPT)], system=due).text == "Reminder: water the plants"
    assert ask(model, [user(HEARTBEAT_PROMPT)]).text == "HEARTBEAT_OK"


def test_a_due_line_someone_commented_out_is_not_due() -> None:
    """Section tests read the section without its HTML comments (notes to the people who edit
    the file, as a blank HEARTBEAT.md counts them): the built-in script surfaced a commented-out
    ``due:`` line at every beat; the one left in the open still surfaces."""
    model = ScriptedModel.builtin()
    commented = "## HEARTBEAT.md\n\n<!--\n- due: commented out\n-->\n- look around"
    assert ask(model, [user(HEARTBEAT_PROMPT)], system=commented).text == HEARTBEAT_OK
    both = "## HEARTBEAT.md\n\n<!-- due: old -->\n- due: water the plants"
    assert ask(model, [user(HEARTBEAT_PROMPT)], system=both).text == "Reminder: water the plants"


# --- matching ------------------------------------------------------------------------------------


def test_first_matching_rule_wins() -> None:
    """Rules are tried in file order and the first whose conditions hold answers."""
    model = model_of(
        {"when": {"user_contains": "b"}, "text": "first"},
        {"when": {"user_contains": "a"}, "text": "second"},
        {"text": "third"},
    )
    assert ask(model, [user("ab")]).text == "first"
    assert ask(model, [user("a")]).text == "second"
    assert ask(model, [user("z")]).text == "third"


def test_no_rule_matches_gives_the_fixed_fallback() -> None:
    """With no matching rule the answer is the fixed fallback text."""
    model = model_of({"when": {"user_contains": "never"}, "text": "x"})
    answer = ask(model, [user("hello")])
    assert answer.text == FALLBACK_TEXT
    assert answer.tool_calls == ()


def test_all_conditions_of_a_rule_must_hold() -> None:
    """A rule with several conditions fails when any one of them fails."""
    model = model_of(
        {"when": {"user_contains": "hi", "system_contains": "Bo"}, "text": "both"},
        {"text": "not both"},
    )
    assert ask(model, [user("hi")]).text == "not both"
    assert ask(model, [user("hi")], system="## SOUL.md\n\nBo").text == "both"


def test_user_condition_reads_only_the_last_user_message() -> None:
    """user_contains looks at the latest user message, not earlier ones."""
    model = model_of({"when": {"user_contains": "old"}, "text": "saw old"}, {"text": "new"})
    history = [user("old"), Message(role="assistant", content="ok"), user("fresh")]
    assert ask(model, history).text == "new"


def test_section_condition_reads_only_that_section() -> None:
    """section_contains matches the named section's body, not the rest of the prompt."""
    model = model_of(
        {"when": {"section": "MEMORY.md", "section_contains": "tea"}, "text": "tea in memory"},
        {"when": {"section": "SOUL.md", "section_contains": "tea"}, "text": "tea in soul"},
        {"text": "none"},
    )
    assert ask(model, [user("x")]).text == "tea in memory"
    assert ask(model, [user("x")], system="## SOUL.md\n\ntea").text == "tea in soul"
    assert ask(model, [user("x")], system="tea").text == "none"


def test_system_regex_and_user_regex() -> None:
    """Regex conditions use re.search and their captures feed {match}."""
    model = model_of(
        {"when": {"system_regex": r"I am (\w+)\.", "user_regex": r"^hi$"}, "text": "{match}"},
        {"when": {"system_regex": r"I am (\w+)\."}, "text": "name={match}"},
    )
    assert ask(model, [user("hi")]).text == "hi"  # the user regex's match wins
    assert ask(model, [user("yo")]).text == "name=Ava"


def test_heartbeat_condition_both_ways() -> None:
    """heartbeat=true needs HEARTBEAT_PROMPT in the user message; heartbeat=false its absence."""
    model = model_of(
        {"when": {"heartbeat": True}, "text": "beat"},
        {"when": {"heartbeat": False}, "text": "talk"},
    )
    wake = f"{HEARTBEAT_PROMPT}\n\nInbox (1 entry, oldest first):"
    assert ask(model, [user(wake)]).text == "beat"
    assert ask(model, [user("Heartbeat?")]).text == "talk"


def test_tool_results_counts_only_results_since_the_last_user_message() -> None:
    """tool_results is an exact count of tool messages after the last user message."""
    model = model_of(
        {"when": {"tool_results": 2}, "text": "two: {tool_result} / {last_tool_result}"},
        {"when": {"tool_results": 0}, "text": "zero"},
        {"text": "other {tool_results}"},
    )
    call = Message(role="assistant", tool_calls=())
    assert ask(model, [user("a")]).text == "zero"
    assert ask(model, [user("a"), call, tool("r1")]).text == "other 1"
    assert ask(model, [user("a"), call, tool("r1"), tool("r2")]).text == "two: r1 / r2"
    older = [user("a"), call, tool("r1"), tool("r2"), user("b")]
    assert ask(model, older).text == "zero"


def test_tool_and_tool_error_conditions() -> None:
    """`tool` needs the tool offered; `tool_error` tests the latest tool result's error flag."""
    model = model_of(
        {"when": {"tool": "transcript_search"}, "text": "can search"},
        {"when": {"tool_error": True}, "text": "failed: {last_tool_result}"},
        {"when": {"tool_error": False}, "text": "fine"},
        {"text": "no results"},
    )
    assert ask(model, [user("a")], tools=(MEMORY, SEARCH)).text == "can search"
    assert ask(model, [user("a")]).text == "no results"
    assert ask(model, [user("a"), tool("bad", is_error=True)]).text == "failed: bad"
    assert ask(model, [user("a"), tool("ok")]).text == "fine"


# --- substitutions -------------------------------------------------------------------------------


def test_substitutions_apply_recursively_inside_args() -> None:
    """Placeholders are replaced in nested args (tables and lists); keys and non-strings kept."""
    model = model_of(
        {
            "when": {"user_regex": r"(\w+) and (\w+)"},
            "calls": [
                {
                    "tool": "memory",
                    "args": {
                        "text": "{match1}+{match2}",
                        "nested": {"list": ["{match0}", 3, True], "user": "{user}"},
                    },
                }
            ],
        }
    )
    (call,) = ask(model, [user("cats and dogs")]).tool_calls
    assert dict(call.arguments) == {
        "text": "cats+dogs",
        "nested": {"list": ["cats and dogs", 3, True], "user": "cats and dogs"},
    }


def test_match_without_groups_is_the_whole_match_and_braces_escape() -> None:
    """{match} is the whole match when the regex has no group; {{ and }} are literal braces."""
    model = model_of({"when": {"user_regex": r"\d+"}, "text": "{{n}} = {match}"})
    assert ask(model, [user("take 42 now")]).text == "{n} = 42"


def test_substituted_values_are_not_expanded_again() -> None:
    """A user message containing a placeholder is echoed as is, not expanded."""
    model = model_of({"text": "you said: {user}"})
    assert ask(model, [user("{sections}")]).text == "you said: {sections}"


def test_section_and_user_short_placeholders() -> None:
    """{section} is the named section's body; {user_short} the first line, cut to 80 chars."""
    model = model_of({"when": {"section": "MEMORY.md"}, "text": "[{section}] {user_short}"})
    long = "x" * 100 + "\nsecond line"
    assert ask(model, [user(long)]).text == "[- likes tea] " + "x" * 80 + "…"


def test_tool_call_ids_are_unique_within_a_turn() -> None:
    """Each call gets an id unique in the conversation (index of message and call)."""
    model = model_of({"calls": [{"tool": "a"}, {"tool": "b"}]})
    first = ask(model, [user("x")])
    second = ask(model, [user("x"), first.as_message(), tool("r", call_id=first.tool_calls[0].id)])
    ids = [c.id for c in first.tool_calls + second.tool_calls]
    assert len(set(ids)) == 4


# --- sleep, usage, protocol ---------------------------------------------------------------------


def test_sleep_goes_through_the_injected_clock() -> None:
    """A rule's sleep advances the injected clock by that many seconds (no real sleeping)."""
    clock = VirtualClock()
    model = ScriptedModel.from_rules({"rules": [{"text": "slow", "sleep": 7.5}]}, clock=clock)
    before = clock.monotonic()
    assert ask(model, [user("x")]).text == "slow"
    assert clock.monotonic() - before == 7.5


def test_a_sleep_longer_than_the_turn_has_left_ends_at_the_turns_limit() -> None:
    """Inside a turn with 3 s left, a rule sleeping 1e9 s sleeps 3 s and raises TurnTimeUp
    naming the rule and the setting (the turn ends incomplete, max_seconds), as an HTTP
    model's try would: it slept on past SOULFLEET_TURN_MAX_SECONDS."""
    clock = VirtualClock()
    model = ScriptedModel.from_rules(
        {"rules": [{"name": "forever", "text": "slow", "sleep": 1e9}]}, clock=clock
    )
    before = clock.monotonic()
    with turn_deadline(3.0), pytest.raises(TurnTimeUp, match="'forever' sleeps 1e\\+09s"):
        ask(model, [user("x")])
    assert 2.5 < clock.monotonic() - before <= 3.0


def test_usage_is_estimated_at_four_characters_a_token() -> None:
    """Input tokens ~ (system + messages) / 4, output ~ answer / 4, both rounded up."""
    model = model_of({"text": "abcdefghi"})
    answer = model.complete(system="12345678", messages=[user("1234")], tools=())
    assert answer.usage.input_tokens == 3
    assert answer.usage.output_tokens == 3


def test_is_a_model() -> None:
    """ScriptedModel satisfies the Model protocol and reports its spec."""
    model = model_of({"text": "x"})
    assert isinstance(model, Model)
    assert model.spec == "scripted:<inline>"
    assert ScriptedModel.builtin().spec == BUILTIN_SPEC


def test_sections_of_ignores_non_file_headings() -> None:
    """Only "## <name>.md" headers split sections; a "## Goals" heading stays in the body."""
    soul = "## SOUL.md\n\nme\n\n## Goals\n\nbe kind\n\n## USER.md\n\nyou"
    assert sections_of(soul) == {"SOUL.md": "me\n\n## Goals\n\nbe kind", "USER.md": "you"}


# --- the built-in script -------------------------------------------------------------------------


def beat(system: str, tools: Sequence[ToolSpec] = (MEMORY,)) -> str:
    return ask(ScriptedModel.builtin(), [user(HEARTBEAT_PROMPT)], system=system, tools=tools).text


def test_builtin_script_is_package_data() -> None:
    """default_script.toml ships inside the package and loads via importlib.resources."""
    resource = importlib.resources.files("workers.persona.models").joinpath("default_script.toml")
    assert resource.is_file()
    assert len(ScriptedModel.builtin().rules) >= 5


@pytest.mark.parametrize(
    ("line", "reminder"),
    [
        ("due: water the plants", "Reminder: water the plants"),
        ("- DUE: call mum  ", "Reminder: call mum"),
        ("* Due:feed the cat", "Reminder: feed the cat"),
    ],
)
def test_builtin_surfaces_a_due_line(line: str, reminder: str) -> None:
    """On a heartbeat, a "due: X" line in HEARTBEAT.md (any case, bulleted or not) surfaces."""
    system = f"## SOUL.md\n\nme\n\n## HEARTBEAT.md\n\nroutine\n{line}\n\n## MEMORY.md\n\n- x"
    assert beat(system) == reminder


@pytest.mark.parametrize(
    "system",
    [
        "## SOUL.md\n\nme",
        "## HEARTBEAT.md\n\n- check the mail",
        "## HEARTBEAT.md\n\nnothing is overdue: relax",
        "## SOUL.md\n\ndue: not in heartbeat\n\n## HEARTBEAT.md\n\nquiet",
    ],
)
def test_builtin_is_silent_when_nothing_is_due(system: str) -> None:
    """On a heartbeat with no due line in HEARTBEAT.md the built-in script says HEARTBEAT_OK."""
    assert beat(system) == HEARTBEAT_OK


def test_builtin_answers_a_message_that_joined_a_heartbeat() -> None:
    """A post arriving while a heartbeat was queued joins that turn: the inbox comes after
    the heartbeat prompt. With nothing due, HEARTBEAT_OK was the person's answer (silent, so
    none), and with a due line the reminder was, the post ignored; the message is answered
    instead (what is due surfaces at the next heartbeat). A pure heartbeat stays silent, or
    surfaces its due line."""
    model = ScriptedModel.builtin()
    item = InboxItem(text="hello are you back", sender="cli", channel="run", id="1", at=0)
    mixed = render_inbox([item], 2, persona="cara")
    system = "## HEARTBEAT.md\n\n- check the mail"
    answer = ask(model, [user(mixed)], system=system, tools=(MEMORY,)).text
    assert answer.endswith("echo the first entry: hello are you back")
    ticks_only = render_inbox([], 2, persona="cara")
    assert ask(model, [user(ticks_only)], system=system, tools=(MEMORY,)).text == HEARTBEAT_OK
    due = "## HEARTBEAT.md\n\ndue: water the plants"
    answer = ask(model, [user(mixed)], system=due, tools=(MEMORY,)).text
    assert answer.endswith("echo the first entry: hello are you back")  # not the reminder
    assert ask(model, [user(ticks_only)], system=due, tools=(MEMORY,)).text == (
        "Reminder: water the plants"
    )


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ("remember: the cat is Tom", "the cat is Tom"),
        ("Please remember that I like tea.", "I like tea."),
    ],
)
def test_builtin_remembers(message: str, text: str) -> None:
    """The built-in script: "remember: X" / "remember that X" -> memory add X, then the answer."""
    model = ScriptedModel.builtin()
    first = ask(model, [user(message)])
    (call,) = first.tool_calls
    assert call.name == "memory"
    assert dict(call.arguments) == {"action": "add", "target": "self", "text": text}
    done = ask(model, [user(message), first.as_message(), tool("added: " + text)])
    assert done.text == f"Noted. added: {text}"
    failed = ask(model, [user(message), first.as_message(), tool("locked", is_error=True)])
    assert failed.text == "I could not note that: locked"


def test_builtin_reads_memory_back_when_asked_what_it_remembers() -> None:
    """ "what do you remember?" -> memory read of MEMORY.md, then its text (or why not)."""
    model = ScriptedModel.builtin()
    question = "So, what do you remember?"
    first = ask(model, [user(question)])
    (call,) = first.tool_calls
    assert call.name == "memory"
    assert dict(call.arguments) == {"action": "read", "target": "self"}
    history = [user(question), first.as_message()]
    done = ask(model, [*history, tool("- my favourite tea is genmaicha")])
    assert done.text == "My MEMORY.md as it is now:\n- my favourite tea is genmaicha"
    failed = ask(model, [*history, tool("unknown action 'read'", is_error=True)])
    assert failed.text == "I could not read my memory: unknown action 'read'"
    # A fleet turn asks through its rendered inbox (`soulfleet run`).
    item = InboxItem(text="what do you remember?", sender="cli", channel="run", id="1", at=0)
    inbox = render_inbox([item], 0, persona="nora")
    (call,) = ask(model, [user(inbox)]).tool_calls
    assert dict(call.arguments) == {"action": "read", "target": "self"}


def test_builtin_answers_plainly_otherwise() -> None:
    """Anything else gets a plain answer naming the built-in scripted model and echoing."""
    text = ask(ScriptedModel.builtin(), [user("what is on my plate?")]).text
    assert "built-in scripted model" in text
    assert text.endswith("what is on my plate?")


def test_builtin_without_memory_does_not_call_it() -> None:
    """A read-only persona (no memory tool) asked to remember gets a plain answer, no call."""
    answer = ask(ScriptedModel.builtin(), [user("remember: x")], tools=())
    assert answer.tool_calls == ()
    assert "built-in scripted model" in answer.text


def test_builtin_echoes_the_first_entry_of_a_woken_inbox() -> None:
    """A rendered inbox (no ticks) gets a plain answer echoing its first entry's text."""
    inbox = render_inbox(
        [
            InboxItem(
                text="the parcel arrived\nat noon", sender="door", channel="hook", id="1", at=0
            ),
            InboxItem(text="second", sender="ava", channel="cli", id="2", at=1),
        ],
        0,
        persona="ava",
    )
    text = ask(ScriptedModel.builtin(), [user(inbox)]).text
    assert "built-in scripted model" in text
    assert text.endswith("echo the first entry: second")


def test_builtin_writes_down_a_remember_item_that_rides_on_a_heartbeat() -> None:
    """`soulfleet post milo "remember: X" --no-wake` waits for milo's next heartbeat, whose
    message is the heartbeat prompt plus the inbox. The built-in script must write X down, as
    the README says it writes down the first `remember: X` of a turn; answering HEARTBEAT_OK
    makes the beat silent, which keeps nothing of it in the session, so the item is lost."""
    item = InboxItem(text="remember: the cat is Tom", sender="cli", channel="cli", id="1", at=0)
    wake = f"{HEARTBEAT_PROMPT}\n\n{render_inbox([item], 1, persona='milo')}"
    answer = ask(ScriptedModel.builtin(), [user(wake)], system="## HEARTBEAT.md\n\n- nothing")
    assert answer.text != HEARTBEAT_OK
    (call,) = answer.tool_calls
    assert dict(call.arguments) == {"action": "add", "target": "self", "text": "the cat is Tom"}
