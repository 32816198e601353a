"""workers/fleet/registry.py: persona names under a root, and the two lanes each persona has."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.fleet.errors import UnknownPersona, UnusablePersonaName
from workers.fleet.registry import PersonaRegistry, valid_persona_name


def test_names_are_the_valid_subdirectories_sorted(tmp_path: Path) -> None:
    """Files, hidden dirs and names that cannot be lanes are not personas."""
    for name in ("nora", "ava", ".git", "bad name", "x-dreamer"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("not a persona")
    assert PersonaRegistry(tmp_path).names() == ["ava", "nora"]
    assert PersonaRegistry(tmp_path / "missing").names() == []


@pytest.mark.parametrize(
    ("name", "ok"),
    [("ava", True), ("Ava-2.b_c", True), ("a" * 64, True), ("a" * 65, False), ("", False),
     ("../x", False), ("a/b", False), ("-x", False), ("a..b", False), ("ava-dreamer", False)],
)  # fmt: skip
def test_valid_persona_name(name: str, ok: bool) -> None:
    """A name becomes a Redis key and a lane id: a short slug, never a dreamer lane's name."""
    assert valid_persona_name(name) is ok


def test_resolve_accepts_a_name_or_a_path_inside_the_root(tmp_path: Path) -> None:
    """`ava` and `<root>/ava` both resolve; a missing persona or a path elsewhere does not."""
    (tmp_path / "root" / "ava").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    registry = PersonaRegistry(tmp_path / "root")
    assert registry.resolve("ava") == "ava"
    assert registry.resolve(str(tmp_path / "root" / "ava")) == "ava"
    assert registry.home("ava") == tmp_path / "root" / "ava"
    for wrong in ("bob", str(tmp_path / "elsewhere"), "../root/ava"):
        with pytest.raises(UnknownPersona):
            registry.resolve(wrong)


@pytest.mark.parametrize(
    ("directory", "suggested"),
    [("my persona", "my-persona"), ("zoë", "zoe"), ("x-dreamer", "x_dreamer"), ("a..b", "a.b")],
)
def test_a_directory_with_an_unusable_name_says_so_and_suggests_one(
    tmp_path: Path, directory: str, suggested: str
) -> None:
    """A directory that IS under the root but whose name cannot be a persona's is not reported
    as missing: the error says the name is the problem and suggests a usable one; the
    registry lists it among the skipped."""
    (tmp_path / directory).mkdir()
    registry = PersonaRegistry(tmp_path)
    for arg in (directory, str(tmp_path / directory)):
        with pytest.raises(UnusablePersonaName) as caught:
            registry.resolve(arg)
        assert "is not a usable persona name" in str(caught.value)
        assert f"for example to {suggested!r}" in str(caught.value)
        assert "no directory" not in str(caught.value)
    assert registry.unusable_names() == [directory]
    assert registry.names() == []


@pytest.mark.parametrize("arg", ["..", "."])
def test_a_path_step_is_refused_without_rename_advice(tmp_path: Path, arg: str) -> None:
    """`soulfleet post .. hi` named no directory to rename: the error used to suggest renaming
    the personas root's parent ("rename it, for example to 'persona'")."""
    registry = PersonaRegistry(tmp_path / "personas")
    (tmp_path / "personas").mkdir()
    with pytest.raises(UnknownPersona) as caught:
        registry.resolve(arg)
    assert "rename" not in str(caught.value)


def test_lanes_round_trip() -> None:
    """A persona's own lane is its name; its dreamer's lane carries the suffix."""
    assert PersonaRegistry.lane_of("ava") == "ava"
    assert PersonaRegistry.lane_of("ava", "dream") == "ava-dreamer"
    assert PersonaRegistry.parse_lane("ava-dreamer") == ("ava", "dreamer")
    assert PersonaRegistry.parse_lane("ava") == ("ava", "persona")


@pytest.mark.parametrize("name", ["ava\n", "x-dreamer\n"])
def test_a_name_ending_in_a_newline_is_not_a_persona_name(tmp_path: Path, name: str) -> None:
    """``$`` matches before a trailing newline: ``ava\\n`` passed as a slug, became a lane and
    Redis keys of its own, printed in status as a second ``ava`` row (and ``x-dreamer\\n``
    slipped past the dreamer-suffix rule). It is an unusable name, skipped and reported."""
    (tmp_path / name).mkdir()
    (tmp_path / "ava").mkdir(exist_ok=True)
    assert valid_persona_name(name) is False
    registry = PersonaRegistry(tmp_path)
    assert registry.names() == ["ava"]
    assert name in registry.unusable_names()
    with pytest.raises(UnusablePersonaName):
        registry.home(name)
