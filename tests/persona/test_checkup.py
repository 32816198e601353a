"""The persona check-up every front door runs: what fails a turn raises, what runs oddly warns."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.persona import make_persona
from workers.persona.checkup import check_persona
from workers.persona.errors import ModelSpecError, PersonaConfigError, PersonaFileError
from workers.persona.mcp_servers import parse_mcp_servers
from workers.persona.models.config import ModelConfig


def test_a_soul_over_the_turn_budget_is_a_warning_naming_the_setting(tmp_path: Path) -> None:
    """A soul estimated over SOULFLEET_TURN_MAX_TOKENS can never run a model call (the loop
    refuses a call whose input alone exceeds the budget): the check-up says so, naming the
    setting and what to shrink, before work is queued. Under the budget, or with no budget
    given, there is no such warning."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are ava.\n", "MEMORY.md": "m" * 40_000})
    [warning] = check_persona(home, turn_max_tokens=5_000).warnings
    assert "SOULFLEET_TURN_MAX_TOKENS=5000" in warning
    assert "MEMORY.md" in warning
    assert check_persona(home, turn_max_tokens=50_000).warnings == []
    assert check_persona(home).warnings == []


def test_a_soul_over_session_max_tokens_warns_that_no_conversation_goes_on(
    tmp_path: Path,
) -> None:
    """``[session] max_tokens = 10`` was accepted without a word, and every turn then started
    a new session (the frozen soul alone over the session budget): the check-up every front
    door runs says so, naming the key; with room for the soul, no such warning."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are ava. " * 20})
    (home / "persona.toml").write_text("[session]\nmax_tokens = 10\n", encoding="utf-8")
    [warning] = check_persona(home).warnings
    assert "session.max_tokens (10)" in warning
    assert "every turn starts a new session" in warning
    (home / "persona.toml").write_text("[session]\nmax_tokens = 1000\n", encoding="utf-8")
    assert check_persona(home).warnings == []


def test_an_invalid_file_raises_what_a_turn_would(tmp_path: Path) -> None:
    """A directory where SOUL.md should be fails the check-up as it fails a turn."""
    home = make_persona(tmp_path / "bob", {"MEMORY.md": "x\n"})
    (home / "SOUL.md").mkdir()
    with pytest.raises(PersonaFileError, match=r"SOUL\.md"):
        check_persona(home)


def test_a_python_tool_ref_the_turn_would_refuse_fails_the_check_up(tmp_path: Path) -> None:
    """`ref = "os:abort"` (a callable not marked as a tool factory) is refused here as the
    turn's tool building refuses it: a post to such a persona was accepted and its lane
    dead-lettered. A good ref passes."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are ava.\n"})
    (home / "persona.toml").write_text('[[tools.python]]\nref = "os:abort"\n')
    with pytest.raises(PersonaConfigError, match="not marked as a tool factory"):
        check_persona(home)
    (home / "persona.toml").write_text(
        '[[tools.python]]\nref = "tests.support.python_tools:shout"\n'
    )
    assert check_persona(home).agent.name == "ava"


def test_two_python_tools_giving_one_name_fail_the_check_up(tmp_path: Path) -> None:
    """Two [[tools.python]] entries giving one tool name (here one ref twice) are refused here,
    naming both, as the turn's toolbox refuses them: the post was accepted and the lane
    dead-lettered at its first turn."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are ava.\n"})
    (home / "persona.toml").write_text(
        '[[tools.python]]\nref = "tests.support.python_tools:shout"\n'
        '[[tools.python]]\nref = "tests.support.python_tools:shout"\n'
    )
    with pytest.raises(PersonaConfigError, match=r"'tools\.python\[1\]'.*'shout', and so does "
                       r"tools\.python\[0\]"):  # fmt: skip
        check_persona(home)
    (home / "persona.toml").write_text(
        '[[tools.python]]\nref = "tests.support.python_tools:shout"\n'
        '[[tools.python]]\nref = "tests.support.python_tools:slow"\n'
    )
    assert check_persona(home).agent.name == "ava"


def test_misnamed_persona_files_and_a_heartbeat_with_nothing_to_read_are_warnings(
    tmp_path: Path,
) -> None:
    """soul.md and heartbeat.md (lower case) are read by nothing: each is a warning naming the
    right name (a heartbeat.md left every beat skipped without a word). The right names warn of
    nothing."""
    home = make_persona(tmp_path / "ava", {"IDENTITY.md": "I am ava.\n"})
    (home / "soul.md").write_text("You are ava.\n")
    (home / "heartbeat.md").write_text("- due: stretch\n")
    (home / "persona.toml").write_text('[heartbeat]\nevery = "30m"\n')
    warnings = check_persona(home).warnings
    assert "persona ava: soul.md is not read, names are case-sensitive: rename it to SOUL.md" in (
        warnings
    )
    assert any("heartbeat.md is not read" in w and "HEARTBEAT.md" in w for w in warnings)
    (home / "soul.md").rename(home / "SOUL.md")
    (home / "heartbeat.md").rename(home / "HEARTBEAT.md")
    assert check_persona(home).warnings == []


def test_a_use_the_fleet_mcp_config_lacks_fails_the_check_up_given_that_config(
    tmp_path: Path,
) -> None:
    """`use = "time"` with no fleet server of that name is refused, naming the key and the
    servers known, as the turn's tool building refuses it; a config that has the server passes,
    and without a fleet config in view (None) the use is not judged."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are ava.\n"})
    (home / "persona.toml").write_text('[[tools.mcp]]\nname = "clock"\nuse = "time"\n')
    with pytest.raises(PersonaConfigError, match=r"tools\.mcp\[0\]\.use.*SOULFLEET_MCP_CONFIG"):
        check_persona(home, mcp_servers={})
    time_server = parse_mcp_servers('{"mcpServers": {"time": {"command": "mcp-server-time"}}}')
    assert check_persona(home, mcp_servers=time_server).agent.name == "ava"
    assert check_persona(home).agent.name == "ava"


def test_a_missing_key_for_the_shells_default_model_says_the_workers_use_their_own(
    tmp_path: Path,
) -> None:
    """A persona without a model of its own runs on SOULFLEET_MODEL; when this shell's needs a
    key it lacks, the warning says the model is this shell's setting and that the workers use
    theirs (it said the workers must have the key, of a model they may never use). A model the
    persona.toml names keeps the plain warning."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are Ava.\n"})
    shell = ModelConfig(default_spec="anthropic:claude-x")
    (warning,) = check_persona(home, shell).warnings
    assert "names no model in its persona.toml; this shell's SOULFLEET_MODEL" in warning
    assert "needs ANTHROPIC_API_KEY" in warning
    assert "The workers use their own SOULFLEET_MODEL" in warning
    (home / "persona.toml").write_text('model = "anthropic:claude-x"\n')
    (warning,) = check_persona(home, shell).warnings
    assert "persona ava's model 'anthropic:claude-x' needs ANTHROPIC_API_KEY" in warning
    assert "the workers that run its turns must have it" in warning


def test_a_model_chosen_with_run_local_model_is_blamed_for_its_own_missing_key(
    tmp_path: Path,
) -> None:
    """run --local --model X, X's key not set here: the refusal names --model and says to
    choose another, not the persona's model and "without --local" (where --model is refused)."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are Ava.\n"})
    with pytest.raises(ModelSpecError) as caught:
        check_persona(home, ModelConfig(), model="anthropic:claude-x", calls_model=True)
    message = str(caught.value)
    assert "the model given with --model, 'anthropic:claude-x', needs ANTHROPIC_API_KEY" in message
    assert "choose another --model" in message
    assert "without --local" not in message


@pytest.mark.parametrize("kept", ["transcripts", "sessions"])
def test_a_conversation_directory_leading_out_of_the_persona_fails_the_check_up(
    tmp_path: Path, kept: str
) -> None:
    """transcripts/ or sessions/ a symlink out of the persona: every turn refuses it (and the
    lane is dead-lettered), so the check-up does too, naming the path and where it leads. The
    door accepted the post, and status called the dead lane fixed while the link stood."""
    home = make_persona(tmp_path / "ava", {"SOUL.md": "You are ava.\n"})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (home / kept).symlink_to(outside)
    with pytest.raises(PersonaFileError, match="outside the persona directory") as caught:
        check_persona(home)
    assert f"{kept}/ava" in str(caught.value)
    (home / kept).unlink()
    (home / kept).mkdir()
    (home / kept / "ava-dreamer").symlink_to(outside)
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        check_persona(home)
    (home / kept / "ava-dreamer").unlink()
    assert check_persona(home).agent.name == "ava"
