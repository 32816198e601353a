"""workers/persona/edits.py: which load failures are an edit in progress, and which are final."""

from __future__ import annotations

import os
import time
from pathlib import Path

from workers.persona.edits import EDIT_GRACE_SECONDS, while_editing
from workers.persona.errors import (
    ModelSpecError,
    PersonaConfigError,
    PersonaEditing,
    PersonaFileError,
    PersonaNotFound,
    StorageUnavailable,
)


def _home(tmp_path: Path, *, toml_age: float) -> Path:
    home = tmp_path / "ava"
    home.mkdir()
    (home / "persona.toml").write_text("memory = yes\n")
    (home / "rules.toml").write_text("[[rules]]\n")
    stamp = time.time() - toml_age
    for name in ("persona.toml", "rules.toml"):
        os.utime(home / name, (stamp, stamp))
    return home


def test_a_config_error_right_after_its_file_changed_is_an_edit_in_progress(
    tmp_path: Path,
) -> None:
    """persona.toml saved a moment ago and invalid: PersonaEditing (transient), raised from
    the original, whose class stays in the message (revive --reason finds it)."""
    home = _home(tmp_path, toml_age=1)
    error = PersonaConfigError(home / "persona.toml", None, "is not valid TOML")
    editing = while_editing(error, home)
    assert isinstance(editing, PersonaEditing)
    assert editing.__cause__ is error
    assert editing.retryable is True
    assert str(editing).startswith("PersonaConfigError: ")
    assert "may be an edit in progress" in str(editing)


def test_the_personas_own_memory_writes_do_not_make_an_old_error_look_fresh(
    tmp_path: Path,
) -> None:
    """The persona rewrites MEMORY.md and USER.md itself (and so its directory's mtime): a
    persona.toml broken for two minutes stays a permanent failure however busy it is."""
    home = _home(tmp_path, toml_age=2 * EDIT_GRACE_SECONDS)
    (home / "MEMORY.md").write_text("- just written\n")
    (home / "USER.md").write_text("- also\n")
    error = PersonaConfigError(home / "persona.toml", None, "is not valid TOML")
    assert while_editing(error, home) is error


def test_only_the_personas_own_configuration_gets_the_grace(tmp_path: Path) -> None:
    """A model spec failing on a file in the persona's directory (its rules file) is its own;
    one naming the fleet's SOULFLEET_MODEL file elsewhere, a bootstrap file that is a
    directory, or a transient failure are left as they are."""
    home = _home(tmp_path, toml_age=1)
    rules = ModelSpecError(f"scripted rules {home / 'rules.toml'}: not valid TOML")
    assert isinstance(while_editing(rules, home), PersonaEditing)
    fleet = ModelSpecError("scripted rules file not found: /etc/soulfleet/rules.toml")
    assert while_editing(fleet, home) is fleet
    bootstrap = PersonaFileError(home / "SOUL.md", "is a directory, not a file")
    assert while_editing(bootstrap, home) is bootstrap
    storage = StorageUnavailable(home, "full")
    assert while_editing(storage, home) is storage


def test_a_file_stamped_in_the_future_is_no_edit(tmp_path: Path) -> None:
    """A clock's skew (or `cp -p` from a machine ahead) would otherwise keep a broken persona
    "being edited" until that time."""
    home = _home(tmp_path, toml_age=-3600)
    error = PersonaConfigError(home / "persona.toml", None, "is not valid TOML")
    assert while_editing(error, home) is error


def test_a_persona_directory_gone_gets_the_grace_from_the_personas_root(tmp_path: Path) -> None:
    """PersonaNotFound (the directory moved aside to swap a new version in): the rename
    stamped the personas root, so it is an edit in progress naming the directory; the root
    untouched for longer than the grace, the directory is gone for good. A caller that found
    no directory itself says so with ``gone`` (the fleet's own unknown-persona error)."""
    root = tmp_path / "personas"
    root.mkdir()
    home = root / "ava"
    error = PersonaNotFound(home)
    editing = while_editing(error, home)
    assert isinstance(editing, PersonaEditing)
    assert "its directory changed" in str(editing)
    assert str(editing).startswith("PersonaNotFound: ")
    other = ValueError("unknown persona 'ava'")
    assert while_editing(other, home) is other
    assert isinstance(while_editing(KeyError("ava"), home, gone=True), KeyError)  # not permanent
    old = time.time() - 2 * EDIT_GRACE_SECONDS
    os.utime(root, (old, old))
    assert while_editing(error, home) is error
