"""TomlTable: every reader of a settings table fails the same way, naming the file and the
dotted key, and reads only what the key's type allows."""

from __future__ import annotations

from datetime import time

import pytest

from workers.persona.errors import PersonaConfigError
from workers.persona.toml_table import TomlTable

SOURCE = "/p/ava/persona.toml"


def _table(data: dict[str, object], prefix: str = "heartbeat") -> TomlTable:
    return TomlTable(data, prefix, SOURCE)


def test_errors_name_the_file_and_the_dotted_key() -> None:
    """A nested table's bad value names its full path, so the user finds it in the file."""
    root = TomlTable({"heartbeat": {"active_hours": {"start": "8am"}}}, "", SOURCE)
    hours = root.table("heartbeat")
    assert hours is not None
    inner = hours.table("active_hours")
    assert inner is not None
    with pytest.raises(PersonaConfigError) as caught:
        inner.clock_time("start", allow_24=False)
    assert caught.value.key == "heartbeat.active_hours.start"
    assert str(caught.value).startswith(f"{SOURCE}: key 'heartbeat.active_hours.start' ")


def test_unknown_keys_are_refused_with_the_known_ones_listed() -> None:
    """A typo is an error that says what was meant, never a silently ignored setting."""
    with pytest.raises(PersonaConfigError, match=r"known here: every, model") as caught:
        _table({"evrey": "30m"}).check_keys(("every", "model"))
    assert caught.value.key == "heartbeat.evrey"


def test_of_refuses_what_is_not_a_table() -> None:
    """``tools.mcp[0] = "x"`` is refused at the entry's own key, not at a later lookup."""
    with pytest.raises(PersonaConfigError, match="must be a table") as caught:
        TomlTable.of("x", "tools.mcp[0]", SOURCE)
    assert caught.value.key == "tools.mcp[0]"


def test_string_blank_false_refuses_empty_and_whitespace() -> None:
    """A server name or command that is only spaces is as missing as an absent one."""
    table = _table({"a": "", "b": "  ", "c": 3, "d": "x"})
    for name in ("a", "b", "c"):
        with pytest.raises(PersonaConfigError, match="must be a non-empty string"):
            table.string(name, blank=False)
    assert table.string("d", blank=False) == "x"
    assert table.string("a") == ""  # allowed unless asked otherwise
    assert table.string("missing", "dflt") == "dflt"
    with pytest.raises(PersonaConfigError, match="must be a string, got 3"):
        table.string("c")


def test_pairs_sort_and_check_environment_names() -> None:
    """env keys must be variable names (a child process could not see ``MY-VAR``)."""
    assert _table({"env": {"B": "2", "A": "1"}}).pairs("env", env=True) == (("A", "1"), ("B", "2"))
    with pytest.raises(PersonaConfigError, match="not a valid environment variable") as caught:
        _table({"env": {"MY-VAR": "1"}}).pairs("env", env=True)
    assert caught.value.key == "heartbeat.env.MY-VAR"
    assert _table({"h": {"X-Token": "t"}}).pairs("h", env=False) == (("X-Token", "t"),)
    with pytest.raises(PersonaConfigError, match="table of strings"):
        _table({"env": {"A": 1}}).pairs("env", env=True)


def test_numbers_refuse_booleans() -> None:
    """TOML's ``true`` is not the integer 1 here: ``max_tokens = true`` is a mistake."""
    table = _table({"t": True, "z": 0, "n": -1, "p": 5})
    with pytest.raises(PersonaConfigError, match="positive integer"):
        table.positive_int("t", 1)
    with pytest.raises(PersonaConfigError, match="positive integer"):
        table.positive_int("z", 1)
    assert table.positive_int("p", 1) == 5
    assert table.positive_int("missing", 7) == 7
    assert table.natural("z") == 0
    with pytest.raises(PersonaConfigError, match="whole number >= 0"):
        table.natural("n")
    with pytest.raises(PersonaConfigError, match="true or false"):
        table.boolean("p", False)


def test_clock_time_reads_24_00_only_where_allowed() -> None:
    """``end = "24:00"`` means midnight at the end of the day; a start cannot be 24:00."""
    table = _table({"end": "24:00", "start": "08:30"})
    assert table.clock_time("end", allow_24=True) == time(0, 0)
    assert table.clock_time("start", allow_24=False) == time(8, 30)
    with pytest.raises(PersonaConfigError, match="HH:MM"):
        table.clock_time("end", allow_24=False)
    with pytest.raises(PersonaConfigError, match="is required"):
        table.clock_time("missing", allow_24=False)


def test_timezone_defaults_to_utc_and_refuses_unknown_zones() -> None:
    assert _table({}).timezone("timezone") == "UTC"
    with pytest.raises(PersonaConfigError, match="IANA time zone"):
        _table({"timezone": "Mars/Olympus"}).timezone("timezone")
