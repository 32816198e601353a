"""definitions.py: from_dir's per-process cache of parsed persona.toml, and when it re-reads."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tests.support.persona import make_persona
from workers.persona.agent import from_dir
from workers.persona.definitions import Definitions, definitions
from workers.persona.errors import PersonaConfigError, PersonaNotFound

# Longer than any kernel's timestamp tick: the one blind spot (definitions.py's doc) is an
# in-place same-size rewrite within one tick, which these tests step past on purpose.
TICK = 0.03


def _persona(root: Path, does: str) -> Path:
    return make_persona(root, {"persona.toml": f'does = "{does}"\n'})


def test_unchanged_persona_toml_is_parsed_once(tmp_path: Path) -> None:
    """Two loads of an unchanged persona give the very same parsed object (no re-read)."""
    home = _persona(tmp_path / "ava", "routes")
    cache = Definitions()
    first = cache.load(home)
    assert cache.load(home)[1] is first[1]
    assert cache.load(str(home))[1] is first[1]
    assert first == (home.resolve(), first[1])
    assert first[1].does == "routes"


def test_an_edit_in_the_same_second_is_seen_by_the_next_turn(tmp_path: Path) -> None:
    """A persona.toml edited right after a load (a new size) is obeyed by the next from_dir."""
    home = _persona(tmp_path / "ava", "old")
    assert from_dir(home).does == "old"
    (home / "persona.toml").write_text('does = "newer"\n')
    assert from_dir(home).does == "newer"


def test_same_size_edits_are_seen_by_their_times(tmp_path: Path) -> None:
    """A same-size edit moves mtime_ns; one whose mtime is set back still moves ctime_ns."""
    home = _persona(tmp_path / "ava", "aaa")
    manifest = home / "persona.toml"
    assert from_dir(home).does == "aaa"
    time.sleep(TICK)
    manifest.write_text('does = "bbb"\n')
    assert from_dir(home).does == "bbb"
    before = manifest.stat()
    time.sleep(TICK)
    manifest.write_text('does = "ccc"\n')
    os.utime(manifest, ns=(before.st_atime_ns, before.st_mtime_ns))  # `touch -r` the old time
    assert manifest.stat().st_mtime_ns == before.st_mtime_ns
    assert manifest.stat().st_size == before.st_size
    assert from_dir(home).does == "ccc"


def test_a_file_saved_by_rename_is_seen_even_with_size_and_times_equal(tmp_path: Path) -> None:
    """An editor's save (write a new file, rename it over) is a new inode: seen."""
    home = _persona(tmp_path / "ava", "one")
    manifest = home / "persona.toml"
    assert from_dir(home).does == "one"
    old = manifest.stat()
    fresh = home / "persona.toml.new"
    fresh.write_text('does = "two"\n')
    os.utime(fresh, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(fresh, manifest)
    assert from_dir(home).does == "two"


def test_created_and_deleted_persona_toml(tmp_path: Path) -> None:
    """No persona.toml means defaults; creating one, then deleting it, is seen each time."""
    home = make_persona(tmp_path / "ava")
    assert from_dir(home).does == ""
    (home / "persona.toml").write_text('does = "now"\n')
    assert from_dir(home).does == "now"
    (home / "persona.toml").unlink()
    assert from_dir(home).does == ""


def test_a_re_pointed_home_symlink_is_another_persona(tmp_path: Path) -> None:
    """The path's directory identity is part of the key: a symlink moved to another persona
    directory gives that persona (and its real home), even when neither has a persona.toml."""
    first = make_persona(tmp_path / "first")
    second = make_persona(tmp_path / "second")
    link = tmp_path / "ava"
    link.symlink_to(first, target_is_directory=True)
    assert from_dir(link).home == first.resolve()
    link.unlink()
    link.symlink_to(second, target_is_directory=True)
    assert from_dir(link).home == second.resolve()
    assert from_dir(link).name == "ava"


def test_errors_are_not_cached(tmp_path: Path) -> None:
    """An invalid persona.toml is refused on every load, and its fix is obeyed at once; a
    deleted home is PersonaNotFound even after a cached success."""
    home = _persona(tmp_path / "ava", "fine")
    assert from_dir(home).does == "fine"
    (home / "persona.toml").write_text("evrey = 1\n")
    for _ in range(2):
        with pytest.raises(PersonaConfigError, match="evrey"):
            from_dir(home)
    (home / "persona.toml").write_text('does = "fixed"\n')
    assert from_dir(home).does == "fixed"
    (home / "persona.toml").unlink()
    home.rmdir()
    with pytest.raises(PersonaNotFound):
        from_dir(home)


def test_the_cache_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    """At most max_entries paths are kept; the one used longest ago goes first."""
    cache = Definitions(max_entries=3)
    homes = [_persona(tmp_path / f"p{i}", f"p{i}") for i in range(5)]
    configs = [cache.load(home)[1] for home in homes[:3]]
    assert cache.load(homes[0])[1] is configs[0]  # p0 is now the most recently used
    cache.load(homes[3])
    cache.load(homes[4])
    assert len(cache) == 3
    assert cache.load(homes[0])[1] is configs[0]  # kept
    assert cache.load(homes[1])[1] is not configs[1]  # dropped, parsed again


def test_threads_share_the_cache_while_the_file_changes(tmp_path: Path) -> None:
    """8 threads loading while persona.toml is rewritten never fail or see a value that was
    never written, and once the writes stop every thread sees the last one."""
    home = _persona(tmp_path / "ava", "v0000")
    written = {f"v{n:04d}" for n in range(60)}
    seen: set[str] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.add(from_dir(home).does)
                time.sleep(0.0005)  # leave the writer the GIL now and then
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for n in range(1, 60):
        fresh = home / "persona.toml.new"
        fresh.write_text(f'does = "v{n:04d}"\n')
        os.replace(fresh, home / "persona.toml")
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []
    assert seen <= written
    assert from_dir(home).does == "v0059"


def test_from_dir_uses_the_process_cache(tmp_path: Path) -> None:
    """from_dir goes through the module's shared cache (the fleet's per-turn path)."""
    home = _persona(tmp_path / "ava", "shared")
    first = from_dir(home)
    assert definitions.load(home)[1].does == "shared"
    assert from_dir(home).declared is first.declared


def test_the_plain_definition_is_reused_until_the_file_changes(tmp_path: Path) -> None:
    """from_dir(path) without overrides returns the same frozen AgentDef while persona.toml is
    unchanged; an edit gives a new one, and a call with overrides never gets the shared one."""
    home = _persona(tmp_path / "ava", "same")
    first = from_dir(home)
    assert from_dir(home) is first
    assert from_dir(home, does="other").does == "other"
    assert from_dir(home) is first
    (home / "persona.toml").write_text('does = "edited"\n')
    second = from_dir(home)
    assert second is not first
    assert second.does == "edited"
