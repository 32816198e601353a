"""files.py: confinement, bounded reads, atomic writes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.support.persona import make_persona
from workers.persona import files
from workers.persona.errors import PersonaFileError, PersonaNotFound
from workers.persona.files import confined, read_inside, read_prefix, real_root

# --- confined ------------------------------------------------------------------------------


def test_confined_returns_the_real_path(tmp_path: Path) -> None:
    """A plain relative name resolves under the real root, whether it exists or not."""
    root = make_persona(tmp_path / "ava", {"MEMORY.md": "x"})
    assert confined(root, "MEMORY.md") == root.resolve() / "MEMORY.md"
    assert confined(str(root), "memory/new.md") == root.resolve() / "memory" / "new.md"


@pytest.mark.parametrize("name", ["../x", "memory/../../x", "/etc/passwd", "", ".", "a/../b"])
def test_confined_refuses_traversal_and_absolute(tmp_path: Path, name: str) -> None:
    """'..' anywhere, absolute paths and the root itself are refused with PersonaFileError."""
    with pytest.raises(PersonaFileError):
        confined(tmp_path, name)


def test_confined_refuses_file_symlink_leading_out(tmp_path: Path) -> None:
    """A MEMORY.md that links to a file outside the root is refused, naming where it leads."""
    outside = make_persona(tmp_path / "outside", {"secret.md": "keep"})
    root = make_persona(tmp_path / "ava")
    (root / "MEMORY.md").symlink_to(outside / "secret.md")
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        confined(root, "MEMORY.md")


def test_confined_refuses_directory_symlink_leading_out(tmp_path: Path) -> None:
    """A memory/ directory that links outside is refused for any name beneath it."""
    outside = make_persona(tmp_path / "outside")
    root = make_persona(tmp_path / "ava")
    (root / "memory").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        confined(root, "memory/x.md")


def test_confined_follows_symlink_that_stays_inside(tmp_path: Path) -> None:
    """A link to a file inside the root is followed: the real target is returned."""
    root = make_persona(tmp_path / "ava", {"real/MEMORY.md": "x"})
    (root / "MEMORY.md").symlink_to(root / "real" / "MEMORY.md")
    assert confined(root, "MEMORY.md") == root.resolve() / "real" / "MEMORY.md"


def test_confined_root_may_itself_be_a_symlink(tmp_path: Path) -> None:
    """A persona directory reached through a symlink is confined to its real location."""
    real = make_persona(tmp_path / "real")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert confined(tmp_path / "link", "MEMORY.md") == real.resolve() / "MEMORY.md"


def test_confined_sees_a_symlink_swapped_in_after_a_first_call(tmp_path: Path) -> None:
    """The root's real path is cached, the names below it are not: a directory replaced by a
    link leading out right after a successful call is refused on the very next call."""
    outside = make_persona(tmp_path / "outside")
    root = make_persona(tmp_path / "ava", {"memory/x.md": "x"})
    assert confined(root, "memory/x.md") == root.resolve() / "memory" / "x.md"
    (root / "memory" / "x.md").unlink()
    (root / "memory").rmdir()
    (root / "memory").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        confined(root, "memory/x.md")
    # And a file link re-pointed from inside to outside between two calls.
    (root / "real.md").write_text("r")
    (root / "MEMORY.md").symlink_to(root / "real.md")
    assert confined(root, "MEMORY.md") == root.resolve() / "real.md"
    (root / "MEMORY.md").unlink()
    (root / "MEMORY.md").symlink_to(outside / "secret.md")
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        confined(root, "MEMORY.md")


def test_confined_normalizes_like_a_path(tmp_path: Path) -> None:
    """Doubled slashes, "." parts and a trailing slash name the same file; a name that is only
    "." parts is the root itself and refused."""
    root = make_persona(tmp_path / "ava")
    real = root.resolve()
    assert confined(root, "a//b/./c/") == real / "a" / "b" / "c"
    assert confined(root, Path("notes") / "x.md") == real / "notes" / "x.md"
    for name in ("./", "./.", "//x"):
        with pytest.raises(PersonaFileError):
            confined(root, name)


def test_real_root_is_cached_briefly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root that is a symlink is re-resolved once ROOT_CACHE_SECONDS have passed (the
    documented window in which a re-pointed root still confines to its old target)."""
    first = make_persona(tmp_path / "first")
    second = make_persona(tmp_path / "second")
    link = tmp_path / "link"
    link.symlink_to(first, target_is_directory=True)
    assert real_root(link) == str(first.resolve())
    link.unlink()
    link.symlink_to(second, target_is_directory=True)
    assert real_root(link) == str(first.resolve())  # within the window
    monkeypatch.setattr(files, "ROOT_CACHE_SECONDS", 0.0)
    assert real_root(link) == str(second.resolve())
    assert confined(link, "MEMORY.md") == second.resolve() / "MEMORY.md"


# --- read_prefix ---------------------------------------------------------------------------


def test_read_prefix_bounds_and_absence(tmp_path: Path) -> None:
    """At most limit+1 bytes come back; a missing file is None."""
    make_persona(tmp_path, {"a.md": "0123456789"})
    assert read_prefix(tmp_path / "a.md", 4) == b"01234"
    assert read_prefix(tmp_path / "a.md", 10) == b"0123456789"
    assert read_prefix(tmp_path / "missing.md", 4) is None


def test_read_prefix_reads_past_a_stale_size_hint(tmp_path: Path) -> None:
    """The size taken at open is only a hint: a file that grows after it is read on to the
    limit, and a large file is read whole across chunks."""
    path = tmp_path / "grow.md"
    path.write_bytes(b"a" * 10)
    with path.open("ab") as grower:
        real_fstat = os.fstat

        def stale_fstat(fd: int) -> os.stat_result:
            info = real_fstat(fd)
            grower.write(b"b" * 5000)  # lands after the size was taken
            grower.flush()
            return info

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "fstat", stale_fstat)
            data = read_prefix(path, 100)
    assert data == b"a" * 10 + b"b" * 91
    big = tmp_path / "big.md"
    big.write_bytes(bytes(range(256)) * 12_000)  # ~3 MiB: more than one read chunk
    assert read_prefix(big, 3_000_000) == (bytes(range(256)) * 12_000)[:3_000_001]
    assert read_prefix(big, 10_000_000) == bytes(range(256)) * 12_000


def test_read_prefix_refuses_non_files(tmp_path: Path) -> None:
    """A directory, a FIFO and a dangling link each raise PersonaFileError naming the path."""
    (tmp_path / "dir.md").mkdir()
    os.mkfifo(tmp_path / "fifo.md")
    (tmp_path / "dangling.md").symlink_to(tmp_path / "nowhere")
    cases = (("dir.md", "directory"), ("fifo.md", "regular"), ("dangling.md", "missing"))
    for name, problem in cases:
        with pytest.raises(PersonaFileError, match=problem) as raised:
            read_prefix(tmp_path / name, 10)
        assert raised.value.path == tmp_path / name


def _finishes(fn: object, seconds: float = 10.0) -> list[object]:
    """Run ``fn`` in a daemon thread; the outcome (value or exception) if it ends in time."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())  # type: ignore[operator]
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the read blocked"
    return outcome


def test_read_prefix_refuses_a_device_behind_a_symlink(tmp_path: Path) -> None:
    """A symlink to /dev/zero (an endless file) is refused as a character device, unread."""
    (tmp_path / "HEARTBEAT.md").symlink_to("/dev/zero")
    with pytest.raises(PersonaFileError, match="character device"):
        read_prefix(tmp_path / "HEARTBEAT.md", 10)


def test_read_prefix_decides_on_the_opened_file_not_a_prior_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kind check is on the OPENED descriptor: even when a stat would say "regular file"
    (a file swapped for a FIFO between stat and open), the FIFO is refused without blocking."""
    os.mkfifo(tmp_path / "persona.toml")
    real_stat = os.stat
    regular = real_stat(__file__)

    def lying_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).endswith("persona.toml"):
            return regular
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", lying_stat)
    monkeypatch.setattr(Path, "stat", lambda self, **_: lying_stat(self))
    outcome = _finishes(lambda: read_prefix(tmp_path / "persona.toml", 10))
    assert isinstance(outcome[0], PersonaFileError)
    assert "FIFO" in str(outcome[0])


def test_read_prefix_without_follow_refuses_symlinks(tmp_path: Path) -> None:
    """follow_symlinks=False (transcripts) refuses a symlink even to a regular file."""
    (tmp_path / "real.jsonl").write_text("x")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "real.jsonl")
    assert read_prefix(tmp_path / "link.jsonl", 10) == b"x"
    with pytest.raises(PersonaFileError, match="symlink"):
        read_prefix(tmp_path / "link.jsonl", 10, follow_symlinks=False)


def test_read_inside_reads_files_links_inside_and_hard_links(tmp_path: Path) -> None:
    """A persona's own file is read; a link inside its directory is followed; a file shared by
    several personas through a hard link is read; an absent file is None. A persona directory
    that is itself a link (personas/ava -> /data/ava) reads its files as they are."""
    root = tmp_path / "personas"
    home = make_persona(root / "ava", {"SOUL.md": "me"})
    (root / ".shared").mkdir()
    (root / ".shared" / "AGENTS.md").write_text("house rules")
    os.link(root / ".shared" / "AGENTS.md", home / "AGENTS.md")
    (home / "notes.md").write_text("inside")
    (home / "TOOLS.md").symlink_to("notes.md")
    assert read_inside(home, "SOUL.md", 100) == b"me"
    assert read_inside(home, "AGENTS.md", 100) == b"house rules"
    assert read_inside(home, "TOOLS.md", 100) == b"inside"
    assert read_inside(home, "USER.md", 100) is None
    data = make_persona(tmp_path / "data" / "bob", {"SOUL.md": "bob"})
    (data / "IDENTITY.md").symlink_to(data / "SOUL.md")
    (root / "bob").symlink_to(data, target_is_directory=True)
    assert read_inside(root / "bob", "IDENTITY.md", 100) == b"bob"


@pytest.mark.parametrize(
    "target", ["/proc/self/environ", "/etc/hostname", "../../secret.txt", "../.shared/AGENTS.md"]
)
def test_read_inside_refuses_a_link_leading_out_of_the_persona_directory(
    tmp_path: Path, target: str
) -> None:
    """A persona file linking out of its persona directory (the worker's own environment, a
    host file, a file above the root, a file beside the personas) is refused naming the file
    and where it leads: what it holds would go to the model."""
    root = tmp_path / "personas"
    home = make_persona(root / "ava")
    (tmp_path / "secret.txt").write_text("TOPSECRET")
    (root / ".shared").mkdir()
    (root / ".shared" / "AGENTS.md").write_text("house rules")
    (home / "SOUL.md").symlink_to(target)
    with pytest.raises(PersonaFileError, match=r"SOUL\.md: is a symlink to /.*, outside the "):
        read_inside(home, "SOUL.md", 1 << 20)
    assert files.persona_file_problem(home, "SOUL.md") is not None


def test_read_inside_refuses_a_directory_swapped_for_a_link_after_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SOUL.md -> sub/soul.md inside the persona; between the check of that path and its open,
    sub is swapped for a link to a directory outside: the descriptor opened is outside, and
    refused (O_NOFOLLOW guards only the last component)."""
    root = tmp_path / "personas"
    home = make_persona(root / "ava")
    (home / "sub").mkdir()
    (home / "sub" / "soul.md").write_text("inside")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "soul.md").write_text("OUTSIDE")
    (home / "SOUL.md").symlink_to("sub/soul.md")
    checked = os.path.realpath

    def swap_after_check(path: str) -> str:
        real = checked(path)
        if real.endswith("sub/soul.md") and (home / "sub").is_dir():
            (home / "sub").rename(home / "sub.old")
            (home / "sub").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        return real

    monkeypatch.setattr(os.path, "realpath", swap_after_check)
    with pytest.raises(PersonaFileError, match=r"SOUL\.md: is a symlink to .*, which opened as"):
        read_inside(home, "SOUL.md", 100)


def test_read_inside_names_a_dangling_link_and_refuses_paths(tmp_path: Path) -> None:
    """A link (within bounds) to a missing file is an error naming it, not an absent file; a
    name with a slash is a programming error."""
    home = make_persona(tmp_path / "personas" / "ava")
    (home / "TOOLS.md").symlink_to("gone.md")
    with pytest.raises(PersonaFileError, match=r"TOOLS\.md: is a symlink to a missing file"):
        read_inside(home, "TOOLS.md", 100)
    with pytest.raises(ValueError, match="file name"):
        read_inside(home, "memory/x.md", 100)


def test_make_dirs_creates_below_the_root_and_never_the_root(tmp_path: Path) -> None:
    """Nested directories under the persona directory are made; a persona directory renamed
    away meanwhile is NOT made again as an empty stub (PersonaNotFound, nothing created); a
    directory outside the root is refused."""
    home = tmp_path / "ava"
    home.mkdir()
    made = files.make_dirs(home, home / "sessions" / "ava")
    assert made.is_dir()
    files.make_dirs(home, home / "sessions" / "ava")  # exists: fine
    real = Path(real_root(home))  # cached, as a turn's calls see it
    home.rename(tmp_path / "ava-renamed")
    with pytest.raises(PersonaNotFound, match="moved or deleted"):
        files.make_dirs(home, real / "transcripts" / "ava")
    assert not home.exists()
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        files.make_dirs(tmp_path / "ava-renamed", tmp_path / "elsewhere")
