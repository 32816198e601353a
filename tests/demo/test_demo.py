"""The packaged demo personas: complete homes, valid manifests, copied once, never written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workers.fleet.registry import valid_persona_name
from workers.local.demo import (
    DEMO_PERSONAS,
    WELCOME_PERSONA,
    demo_source,
    install_demo,
    welcome_text,
)
from workers.persona.agent import from_dir
from workers.persona.home import BOOTSTRAP_ORDER

_DUE = re.compile(r"(?im)^[ \t]*(?:[-*+][ \t]+)?due[ \t]*:")


def test_every_demo_persona_is_a_full_home(tmp_path: Path) -> None:
    """Each demo persona has every bootstrap file, persona.toml and DREAM.md, and parses."""
    install_demo(tmp_path / "p")
    for name in DEMO_PERSONAS:
        home = tmp_path / "p" / name
        for filename in (*BOOTSTRAP_ORDER, "persona.toml", "DREAM.md"):
            assert (home / filename).is_file(), f"{name}/{filename}"
        agent = from_dir(home)
        assert agent.model == "inherit"


def test_demo_schedules_show_everything_within_a_minute(tmp_path: Path) -> None:
    """ava surfaces (a due line), milo stays silent, nora has no heartbeat but dreams fast."""
    install_demo(tmp_path / "p")
    ava, milo, nora = (from_dir(tmp_path / "p" / name) for name in ("ava", "milo", "nora"))
    assert ava.heartbeat is not None
    assert ava.heartbeat.every <= 30
    assert _DUE.search((ava.home / "HEARTBEAT.md").read_text(encoding="utf-8"))
    assert milo.heartbeat is not None
    assert milo.heartbeat.every <= 30
    assert not _DUE.search((milo.home / "HEARTBEAT.md").read_text(encoding="utf-8"))
    assert nora.heartbeat is None  # the welcome never shares a turn with a heartbeat
    assert nora.dream is not None
    assert nora.dream.every is not None
    assert nora.dream.every <= 30
    assert WELCOME_PERSONA == "nora"
    assert welcome_text(0).startswith("remember: ")


def test_install_copies_once_and_never_overwrites(tmp_path: Path) -> None:
    """An existing destination is left alone; the copy matches the package byte for byte."""
    dest = tmp_path / "p"
    assert install_demo(dest) == list(DEMO_PERSONAS)
    source = demo_source().joinpath("ava").joinpath("SOUL.md").read_bytes()
    assert (dest / "ava" / "SOUL.md").read_bytes() == source
    (dest / "ava" / "SOUL.md").write_text("mine", encoding="utf-8")
    assert install_demo(dest) == []
    assert (dest / "ava" / "SOUL.md").read_text(encoding="utf-8") == "mine"
    assert not any(p.name.endswith(".installing") for p in tmp_path.iterdir())


def test_install_ignores_python_files_in_the_package(tmp_path: Path) -> None:
    """Only persona files are copied: no __init__.py or bytecode lands in a persona home."""
    install_demo(tmp_path / "p")
    names = {p.name for p in (tmp_path / "p").rglob("*")}
    assert not any(name.endswith((".py", ".pyc")) or name == "__pycache__" for name in names)


@pytest.mark.parametrize("name", DEMO_PERSONAS)
def test_demo_persona_names_are_fleet_names(name: str) -> None:
    """Every demo persona name is a valid fleet persona (lane) name."""
    assert valid_persona_name(name)
