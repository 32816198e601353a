"""files.py: confinement, bounded reads, atomic writes."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from tests.support.persona import make_persona, tree
from workers.persona import files
from workers.persona.errors import PersonaFileError
from workers.persona.files import (
    atomic_write_bytes,
    atomic_write_text,
    confined,
    create_bytes,
    read_prefix,
    real_root,
)

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


# --- atomic writes -------------------------------------------------------------------------


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    """The target ends up with exactly the new bytes and no temp file is left behind."""
    target = tmp_path / "MEMORY.md"
    atomic_write_text(target, "first ✓\n")
    assert target.read_bytes() == "first ✓\n".encode()
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert tree(tmp_path) == {"MEMORY.md"}


def test_atomic_write_keeps_permissions(tmp_path: Path) -> None:
    """Replacing a file keeps its permission bits."""
    target = tmp_path / "USER.md"
    target.write_text("x")
    target.chmod(0o600)
    atomic_write_text(target, "y")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_atomic_write_never_writes_through_a_hard_link(tmp_path: Path) -> None:
    """A hard link elsewhere keeps its old bytes: the write replaces the name, not the inode."""
    target = tmp_path / "MEMORY.md"
    target.write_text("old")
    other = tmp_path / "other"
    os.link(target, other)
    atomic_write_text(target, "new")
    assert (target.read_text(), other.read_text()) == ("new", "old")


def test_atomic_write_failure_leaves_no_temp(tmp_path: Path) -> None:
    """When the final rename fails, the error propagates and the temp file is removed."""
    (tmp_path / "MEMORY.md").mkdir()
    (tmp_path / "MEMORY.md" / "keep").write_text("k")
    with pytest.raises(OSError, match="directory"):
        atomic_write_text(tmp_path / "MEMORY.md", "x")
    assert tree(tmp_path) == {"MEMORY.md", "MEMORY.md/keep"}


def test_create_writes_a_new_file_and_its_directory_entry(tmp_path: Path) -> None:
    """A new name gets exactly the bytes, 0o644 (less the umask), and no temp file beside it."""
    target = tmp_path / "s1.f3.json"
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def counting(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", counting)
        create_bytes(target, b'{"id": "s1"}')
    assert target.read_bytes() == b'{"id": "s1"}'
    assert tree(tmp_path) == {"s1.f3.json"}
    assert len(fsyncs) == 2  # the file, then its directory
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_create_never_overwrites_or_follows(tmp_path: Path) -> None:
    """An existing file or a symlink (even a dangling one) under the name is FileExistsError,
    and neither it nor what it points to changes."""
    existing = tmp_path / "a.json"
    existing.write_text("keep")
    with pytest.raises(FileExistsError):
        create_bytes(existing, b"new")
    assert existing.read_text() == "keep"
    outside = tmp_path / "outside"
    link = tmp_path / "b.json"
    link.symlink_to(outside)
    with pytest.raises(FileExistsError):
        create_bytes(link, b"new")
    assert not outside.exists()


def test_create_in_a_missing_directory_is_file_not_found(tmp_path: Path) -> None:
    """The caller makes the directory (a lane's first state) and tries again."""
    with pytest.raises(FileNotFoundError):
        create_bytes(tmp_path / "sessions" / "ava" / "s1.f1.json", b"x")
    assert tree(tmp_path) == set()


def test_reader_never_sees_a_torn_file(tmp_path: Path) -> None:
    """While one thread rewrites a large file, every read sees one whole version or the other."""
    target = tmp_path / "MEMORY.md"
    versions = (b"a" * 1_000_000, b"b" * 1_500_000)
    atomic_write_bytes(target, versions[0])
    done = threading.Event()

    def writer() -> None:
        try:
            for round_ in range(60):
                atomic_write_bytes(target, versions[round_ % 2])
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    try:
        while not done.is_set() or reads == 0:
            assert target.read_bytes() in versions
            reads += 1
    finally:
        thread.join()
    assert reads > 0
    assert tree(tmp_path) == {"MEMORY.md"}


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
