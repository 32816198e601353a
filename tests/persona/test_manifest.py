"""persona.toml: schema, defaults, schedule sections, and errors that name their key."""

from __future__ import annotations

import os
import threading
from datetime import time
from pathlib import Path

import pytest

from tests.support.persona import at
from workers.persona.errors import PersonaConfigError, PersonaFileError, PersonaNotFound
from workers.persona.home import DEFAULT_INDEX_CAP
from workers.persona.manifest import (
    MANIFEST_MAX_BYTES,
    MANIFEST_NAME,
    PersonaConfig,
    load_manifest,
    parse_manifest,
)
from workers.persona.schedules import ActiveHours, DreamSchedule, HeartbeatSchedule
from workers.persona.spend import DailyBudget

FULL = """\
does = "Keeps Ava's calendar and remembers her preferences"
model = "openai:gpt-4o-mini"
memory = true
notes = true
memory_index_cap = { max_lines = 100, max_bytes = 9000 }

[heartbeat]
every = "30m"
active_hours = { start = "08:00", end = "22:00", timezone = "Europe/Berlin" }

[dream]
cron = "0  3 * * *"
timezone = "Europe/Berlin"
window = "1h"
instructions = "Keep birthdays."
"""


def write(home: Path, text: str) -> Path:
    path = home / MANIFEST_NAME
    path.write_text(text, encoding="utf-8")
    return path


def test_absent_file_means_defaults(tmp_path: Path) -> None:
    """A persona without persona.toml gets every default."""
    config = load_manifest(tmp_path)
    assert config == PersonaConfig()
    assert config.model == "inherit"
    assert config.memory is True
    assert config.notes is False
    assert config.memory_index_cap is None
    assert config.heartbeat is None
    assert config.dream is None


def test_full_schema_parses(tmp_path: Path) -> None:
    """Every documented key is read into its typed field."""
    write(tmp_path, FULL)
    config = load_manifest(tmp_path)
    assert config == PersonaConfig(
        does="Keeps Ava's calendar and remembers her preferences",
        model="openai:gpt-4o-mini",
        memory=True,
        notes=True,
        memory_index_cap=(100, 9000),
        heartbeat=HeartbeatSchedule(
            every=1800.0,
            active_hours=ActiveHours(time(8, 0), time(22, 0), "Europe/Berlin"),
        ),
        dream=DreamSchedule(
            every=None,
            cron="0 3 * * *",
            timezone="Europe/Berlin",
            window=3600.0,
            instructions="Keep birthdays.",
        ),
    )


def test_a_byte_order_mark_is_not_a_toml_error(tmp_path: Path) -> None:
    """A persona.toml saved with a UTF-8 byte-order mark (Windows editors add one; no editor
    shows it) reads as without it: it was "not valid TOML ... (at line 1, column 1)"."""
    (tmp_path / MANIFEST_NAME).write_bytes(b"\xef\xbb\xbf" + FULL.encode())
    assert load_manifest(tmp_path) == parse_manifest(FULL)
    # Only at the very start: anywhere else it is a character TOML refuses, as before.
    with pytest.raises(PersonaConfigError, match="not valid TOML"):
        parse_manifest('model = "openai:x"\n\ufeffmemory = true\n')


def test_dream_every_defaults_timezone_and_window(tmp_path: Path) -> None:
    """[dream] every = "24h" alone means UTC, no own window and no instructions."""
    write(tmp_path, '[dream]\nevery = "24h"\n')
    assert load_manifest(tmp_path).dream == DreamSchedule(
        every=86400.0, cron=None, timezone="UTC", window=None, instructions=None
    )


def test_heartbeat_tables_may_be_written_as_sections(tmp_path: Path) -> None:
    """[heartbeat.active_hours] as its own section is the same as an inline table."""
    write(
        tmp_path,
        '[heartbeat]\nevery = "15s"\n[heartbeat.active_hours]\nstart = "22:00"\nend = "06:00"\n',
    )
    heartbeat = load_manifest(tmp_path).heartbeat
    assert heartbeat == HeartbeatSchedule(15.0, ActiveHours(time(22), time(6), "UTC"))


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", DEFAULT_INDEX_CAP), ("false", None), ("{ max_lines = 3 }", (3, 25_600))],
)
def test_memory_index_cap_forms(
    tmp_path: Path, value: str, expected: tuple[int, int] | None
) -> None:
    """memory_index_cap: true is 200 lines / 25600 bytes, false is off, a table fills defaults."""
    write(tmp_path, f"memory_index_cap = {value}\n")
    assert load_manifest(tmp_path).memory_index_cap == expected


def test_default_index_cap_is_the_contract_preset() -> None:
    """memory_index_cap = true means exactly 200 lines / 25,600 bytes."""
    assert DEFAULT_INDEX_CAP == (200, 25_600)


def test_relative_scripted_model_is_anchored_to_the_persona(tmp_path: Path) -> None:
    """A relative scripted:<path> is relative to the persona directory, not the worker's cwd."""
    write(tmp_path, 'model = "scripted:rules.toml"\n')
    assert load_manifest(tmp_path).model == f"scripted:{tmp_path / 'rules.toml'}"


def test_absolute_scripted_model_is_kept(tmp_path: Path) -> None:
    """An absolute scripted:<path> is used as written."""
    write(tmp_path, 'model = "scripted:/srv/rules.toml"\n')
    assert load_manifest(tmp_path).model == "scripted:/srv/rules.toml"


BAD: list[tuple[str, str]] = [
    ("evrey = 1", "evrey"),
    ("does = 1", "does"),
    ("model = 5", "model"),
    ('model = ""', "model"),
    ('model = "gpt-4o"', "model"),
    ("memory = 1", "memory"),
    ('memory = "yes"', "memory"),
    ("notes = 0", "notes"),
    ('notes = "false"', "notes"),
    ("memory_index_cap = 5", "memory_index_cap"),
    ('memory_index_cap = "true"', "memory_index_cap"),
    ("memory_index_cap = { max_lines = 0 }", "memory_index_cap.max_lines"),
    ("memory_index_cap = { max_bytes = -1 }", "memory_index_cap.max_bytes"),
    ("memory_index_cap = { max_lines = true }", "memory_index_cap.max_lines"),
    ("memory_index_cap = { max_lines = 1.5 }", "memory_index_cap.max_lines"),
    ("memory_index_cap = { lines = 3 }", "memory_index_cap.lines"),
    ('heartbeat = "30m"', "heartbeat"),
    ("[heartbeat]", "heartbeat.every"),
    ('[heartbeat]\nevery = "30m"\nfoo = 1', "heartbeat.foo"),
    ('[heartbeat]\nevery = "30m"\nactive_hours = "8-22"', "heartbeat.active_hours"),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { start = "8:00", end = "22:00" }',
        "heartbeat.active_hours.start",
    ),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { start = "24:00", end = "22:00" }',
        "heartbeat.active_hours.start",
    ),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { start = "08:00", end = "22:60" }',
        "heartbeat.active_hours.end",
    ),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { start = "08:00", end = "25:00" }',
        "heartbeat.active_hours.end",
    ),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { end = "22:00" }',
        "heartbeat.active_hours.start",
    ),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { start = "08:00" }',
        "heartbeat.active_hours.end",
    ),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { start = 8, end = "22:00" }',
        "heartbeat.active_hours.start",
    ),
    (
        '[heartbeat]\nevery = "30m"\n'
        'active_hours = { start = "08:00", end = "22:00", timezone = "Mars/Olympus" }',
        "heartbeat.active_hours.timezone",
    ),
    (
        '[heartbeat]\nevery = "30m"\n'
        'active_hours = { start = "08:00", end = "22:00", timezone = "" }',
        "heartbeat.active_hours.timezone",
    ),
    (
        '[heartbeat]\nevery = "30m"\n'
        'active_hours = { start = "08:00", end = "22:00", timezone = "../../etc/passwd" }',
        "heartbeat.active_hours.timezone",
    ),
    (
        '[heartbeat]\nevery = "30m"\nactive_hours = { start = "08:00", end = "22:00", tz = "UTC" }',
        "heartbeat.active_hours.tz",
    ),
    ("dream = 1", "dream"),
    ("[dream]", "dream.every"),
    ('[dream]\ninstructions = "x"', "dream.every"),
    ('[dream]\nevery = "24h"\ncron = "0 3 * * *"', "dream.cron"),
    ('[dream]\ncron = "0 3 * *"', "dream.cron"),
    ('[dream]\ncron = "0 3 * * * *"', "dream.cron"),
    ('[dream]\ncron = ""', "dream.cron"),
    ("[dream]\ncron = 3", "dream.cron"),
    ('[dream]\nevery = "0h"', "dream.every"),
    ('[dream]\ncron = "0 3 * * *"\ntimezone = "Europe/Nowhere"', "dream.timezone"),
    ('[dream]\ncron = "0 3 * * *"\ntimezone = 1', "dream.timezone"),
    ('[dream]\nevery = "24h"\nwindow = "1 h"', "dream.window"),
    ('[dream]\nevery = "24h"\nwindow = 3600', "dream.window"),
    ('[dream]\nevery = "24h"\ninstructions = 1', "dream.instructions"),
    ('[dream]\nevery = "24h"\nat = "03:00"', "dream.at"),
]


@pytest.mark.parametrize(("text", "key"), BAD, ids=[key + ":" + text for text, key in BAD])
def test_bad_value_names_its_key_and_file(tmp_path: Path, text: str, key: str) -> None:
    """Every unknown key or bad value is a PersonaConfigError naming the dotted key and the file."""
    path = write(tmp_path, text + "\n")
    with pytest.raises(PersonaConfigError) as caught:
        load_manifest(tmp_path)
    assert caught.value.key == key
    assert caught.value.path == path
    assert f"'{key}'" in str(caught.value)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    "every", ['"30 m"', '"0m"', '"30"', '"m"', '"1.5h"', '"-1h"', '"30M"', '"1w"', "30", '""']
)
def test_bad_heartbeat_every_names_heartbeat_every(tmp_path: Path, every: str) -> None:
    """A bad [heartbeat] every (format, zero, unit, type) is an error naming heartbeat.every."""
    write(tmp_path, f"[heartbeat]\nevery = {every}\n")
    with pytest.raises(PersonaConfigError) as caught:
        load_manifest(tmp_path)
    assert caught.value.key == "heartbeat.every"


def test_invalid_toml_reports_the_parsers_line_and_column(tmp_path: Path) -> None:
    """Invalid TOML is a PersonaConfigError carrying the parser's line and column."""
    path = write(tmp_path, 'does = "ok"\n[heartbeat\n')
    with pytest.raises(PersonaConfigError) as caught:
        load_manifest(tmp_path)
    assert caught.value.key is None
    assert "line 2, column 11" in str(caught.value)
    assert str(path) in str(caught.value)


def test_non_utf8_manifest_is_a_config_error(tmp_path: Path) -> None:
    """A persona.toml that is not UTF-8 is a PersonaConfigError naming the file."""
    (tmp_path / MANIFEST_NAME).write_bytes(b'does = "\xff"\n')
    with pytest.raises(PersonaConfigError, match="UTF-8"):
        load_manifest(tmp_path)


def test_manifest_that_is_a_directory_is_a_file_error(tmp_path: Path) -> None:
    """persona.toml being a directory is a PersonaFileError naming the path."""
    (tmp_path / MANIFEST_NAME).mkdir()
    with pytest.raises(PersonaFileError, match="is a directory"):
        load_manifest(tmp_path)


def test_missing_home_is_persona_not_found(tmp_path: Path) -> None:
    """Loading the manifest of a directory that does not exist is PersonaNotFound."""
    with pytest.raises(PersonaNotFound):
        load_manifest(tmp_path / "nobody")


def test_parse_manifest_without_source_names_the_key() -> None:
    """Parsing text directly still names the key, with no file in the message."""
    with pytest.raises(PersonaConfigError) as caught:
        parse_manifest("memory = 'no'\n")
    assert caught.value.key == "memory"
    assert caught.value.path is None


def test_end_2400_means_until_midnight(tmp_path: Path) -> None:
    """end = "24:00" parses as midnight: 18:00-24:00 holds in the evening, not after midnight."""
    write(
        tmp_path,
        '[heartbeat]\nevery = "1h"\nactive_hours = { start = "18:00", end = "24:00" }\n',
    )
    heartbeat = load_manifest(tmp_path).heartbeat
    assert heartbeat is not None
    assert heartbeat.active_hours is not None
    hours = heartbeat.active_hours
    assert hours.end == time(0, 0)
    assert hours.contains(at(2024, 1, 15, 23, 59))
    assert not hours.contains(at(2024, 1, 16, 0, 0))
    assert not hours.contains(at(2024, 1, 15, 17, 59))


def test_fifo_or_device_manifest_is_refused_without_blocking(tmp_path: Path) -> None:
    """persona.toml as a FIFO (no writer: a plain read would block forever) or as a symlink to
    /dev/zero (a read would never end) is a PersonaFileError naming the file, at once: the link
    for leading out of the personas' directory, before anything is opened."""
    fifo_home, zero_home = tmp_path / "fifo", tmp_path / "zero"
    fifo_home.mkdir()
    zero_home.mkdir()
    os.mkfifo(fifo_home / "persona.toml")
    (zero_home / "persona.toml").symlink_to("/dev/zero")
    for home, kind in ((fifo_home, "FIFO"), (zero_home, "is a symlink to /dev/zero, outside")):
        outcome: list[BaseException] = []
        thread = threading.Thread(
            target=lambda h=home, out=outcome: _record(out, lambda: load_manifest(h)),
            daemon=True,
        )
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), f"load_manifest blocked on {home}"
        assert isinstance(outcome[0], PersonaFileError)
        assert "persona.toml" in str(outcome[0])
        assert kind in str(outcome[0])


def _record(outcome: list[BaseException], fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:
        outcome.append(exc)


def test_oversize_manifest_is_refused(tmp_path: Path) -> None:
    """A persona.toml past MANIFEST_MAX_BYTES is refused before it is parsed."""
    (tmp_path / "persona.toml").write_text("# pad\n" * (MANIFEST_MAX_BYTES // 6 + 10))
    with pytest.raises(PersonaFileError, match="larger than"):
        load_manifest(tmp_path)


@pytest.mark.parametrize("every", ["1" + "0" * 400 + "d", "3651d", "9" * 5000 + "s"])
def test_overflowing_duration_is_a_config_error(tmp_path: Path, every: str) -> None:
    """A duration too long to schedule (400 digits overflow a float; 5,000 digits are refused
    by int()) is a PersonaConfigError naming heartbeat.every, never an OverflowError."""
    (tmp_path / "persona.toml").write_text(f'[heartbeat]\nevery = "{every}"\n')
    with pytest.raises(PersonaConfigError, match=r"'heartbeat\.every'.*longer than"):
        load_manifest(tmp_path)


SPEND = """\
model = "openai:big"
[heartbeat]
every = "30m"
model = "openai:small"
idle_after = "3d"
idle_every = "6h"
[dream]
every = "24h"
model = "scripted:dream.toml"
[budget]
daily_tokens = 200000
on_exceed = "stop"
timezone = "Europe/Berlin"
"""


def test_spend_keys_parse(tmp_path: Path) -> None:
    """heartbeat.model, dream.model (a relative scripted path anchored at the home),
    heartbeat.idle_after/idle_every and [budget] are read into the config."""
    config = parse_manifest(SPEND, home=tmp_path)
    assert config.heartbeat is not None
    assert config.dream is not None
    assert config.heartbeat.model == "openai:small"
    assert (config.heartbeat.idle_after, config.heartbeat.idle_every) == (3 * 86400, 6 * 3600)
    assert config.dream.model == f"scripted:{tmp_path / 'dream.toml'}"
    assert config.budget == DailyBudget(200000, "stop", "Europe/Berlin")


def test_kind_models_inherit_and_budget_defaults() -> None:
    """heartbeat.model = "inherit" means unset (fleet default, then the persona's model);
    [budget] alone means skip_background in UTC with the fleet's daily_tokens."""
    config = parse_manifest('[heartbeat]\nevery = "1h"\nmodel = "inherit"\n[budget]\n')
    assert config.heartbeat is not None
    assert config.heartbeat.model is None
    assert config.budget == DailyBudget(None, "skip_background", "UTC")


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ('[heartbeat]\nevery = "1h"\nmodel = "gpt-4o"\n', "heartbeat.model", "spec"),
        ('[dream]\nevery = "1h"\nmodel = 3\n', "dream.model", "string"),
        ('[heartbeat]\nevery = "1h"\nidle_after = "3d"\n', "heartbeat.idle_every", "required"),
        (
            '[heartbeat]\nevery = "1h"\nidle_after = "3d"\nidle_every = "10m"\n',
            "heartbeat.idle_every",
            "shorter",
        ),
        ("[budget]\ndaily_tokens = -1\n", "budget.daily_tokens", ">= 0"),
        ('[budget]\ndaily_tokens = "lots"\n', "budget.daily_tokens", "whole number"),
        ('[budget]\non_exceed = "panic"\n', "budget.on_exceed", "skip_background"),
        ('[budget]\ntimezone = "Mars/Base"\n', "budget.timezone", "IANA"),
        ("[budget]\nmonthly = 5\n", "budget.monthly", "not a known key"),
    ],
)
def test_bad_spend_keys_name_the_dotted_key_and_the_file(
    tmp_path: Path, text: str, key: str, says: str
) -> None:
    """Every bad spend value is an error naming its dotted key and the file."""
    path = write(tmp_path, text)
    with pytest.raises(PersonaConfigError) as caught:
        load_manifest(tmp_path)
    assert caught.value.key == key
    assert says in str(caught.value)
    assert str(path) in str(caught.value)


def test_scripted_builtin_in_persona_toml_is_the_built_in_script(tmp_path: Path) -> None:
    """model = "scripted:builtin" names the built-in script; it is not a rules file path
    relative to the persona (it was made into <home>/builtin: "rules file not found")."""
    write(tmp_path, 'model = "scripted:builtin"\n')
    assert load_manifest(tmp_path).model == "scripted:builtin"
    write(tmp_path, 'model = "scripted:rules.toml"\n')
    assert load_manifest(tmp_path).model == f"scripted:{tmp_path / 'rules.toml'}"
