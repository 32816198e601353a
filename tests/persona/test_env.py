"""EnvReader: blank means unset, anything unparseable is a SettingsError naming the variable."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from workers.persona.env import EnvReader
from workers.persona.errors import SettingsError


def _fails(call: Callable[[], object], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        call()
    assert str(caught.value) == message


def test_blank_and_unset_mean_the_default() -> None:
    """Unset, empty and white-space-only values all give the default; values are stripped."""
    env = EnvReader({"EMPTY": "", "SPACES": "  \t", "SET": "  value \n"})
    assert env.raw("UNSET") is None
    assert env.raw("EMPTY") is None
    assert env.raw("SPACES") is None
    assert env.raw("SET") == "value"
    assert env.text("SPACES", "fallback") == "fallback"
    assert env.text("SET", "fallback") == "value"
    assert env.integer("SPACES", 7) == 7
    assert env.number("SPACES", 2.5) == 2.5
    assert env.choice("SPACES", "b", ("a", "b")) == "b"
    assert env.flag("SPACES", True) is True


def test_integer_parses_and_enforces_its_minimum() -> None:
    """Whole numbers parse; a fraction, a word or a value below the minimum is refused."""
    env = EnvReader({"N": " 12 ", "FRACTION": "1.5", "WORD": "ten", "LOW": "0"})
    assert env.integer("N", 0, minimum=12) == 12
    _fails(lambda: env.integer("FRACTION", 1), "FRACTION must be a whole number, got '1.5'")
    _fails(lambda: env.integer("WORD", 1), "WORD must be a whole number, got 'ten'")
    _fails(lambda: env.integer("LOW", 1, minimum=1), "LOW must be >= 1, got 0")


def test_number_parses_and_refuses_nan_and_small_values() -> None:
    """Numbers parse; a word, NaN or a value below the minimum is refused with the raw text."""
    env = EnvReader({"X": "0.25", "WORD": "soon", "NAN": "nan", "LOW": "0.05", "INF": "inf"})
    assert env.number("X", 1.0) == 0.25
    _fails(lambda: env.number("WORD", 1.0), "WORD must be a number, got 'soon'")
    _fails(lambda: env.number("NAN", 1.0), "NAN must be a finite number >= 0, got 'nan'")
    _fails(lambda: env.number("INF", 1.0), "INF must be a finite number >= 0, got 'inf'")
    _fails(lambda: env.number("LOW", 1.0, minimum=0.1), "LOW must be a number >= 0.1, got '0.05'")


@pytest.mark.parametrize("raw", ["inf", "1e309", "-inf", "nan"])
def test_a_duration_that_is_not_finite_says_so_not_that_it_is_too_small(raw: str) -> None:
    """`SOULFLEET_MODEL_TIMEOUT=inf` was refused as "must be a duration >= 0.1s", read as a
    value too small: it says the duration must be finite."""
    env = EnvReader({"T": raw})
    _fails(
        lambda: env.duration("T", 1.0, minimum=0.1),
        f"T must be a finite duration such as 90, 90s, 30m or 6h; got {raw!r}",
    )


def test_choice_is_case_insensitive_and_lists_the_choices() -> None:
    """A choice matches in any case and comes back lower-cased; others list what is allowed."""
    env = EnvReader({"MODE": "Shared", "BAD": "both"})
    assert env.choice("MODE", "local", ("local", "shared")) == "shared"
    _fails(
        lambda: env.choice("BAD", "local", ("local", "shared")),
        "BAD must be one of local, shared; got 'both'",
    )


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("NO", False),
        ("off", False),
    ],
)
def test_flag_spellings(raw: str, value: bool) -> None:
    """Flags accept 1/true/yes/on and 0/false/no/off in any case."""
    assert EnvReader({"F": raw}).flag("F", not value) is value


def test_flag_refuses_anything_else() -> None:
    """A flag that is neither true nor false is refused, not read as false."""
    _fails(
        lambda: EnvReader({"F": "maybe"}).flag("F", False), "F must be true or false, got 'maybe'"
    )
