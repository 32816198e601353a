"""writes.py: atomic replacement and exclusive creation of persona files."""

from __future__ import annotations

import errno
import mmap
import os
import random
import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.persona import tree
from workers.persona import filesystems
from workers.persona.writes import (
    append_bytes,
    atomic_write_bytes,
    atomic_write_text,
    create_bytes,
    open_regular,
    remove_stale_temps,
)


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

    def writer() -> None:
        for round_ in range(60):
            atomic_write_bytes(target, versions[round_ % 2])

    assert _reads_while(writer, lambda: target.read_bytes() in versions) > 0
    assert tree(tmp_path) == {"MEMORY.md"}


def _reads_while(write: Callable[[], None], read_ok: Callable[[], bool]) -> int:
    """Run ``write`` on a thread while this one asserts ``read_ok()`` again and again (at
    least once); how many reads it made."""
    done = threading.Event()

    def writer() -> None:
        try:
            write()
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    try:
        while not done.is_set() or reads == 0:
            assert read_ok()
            reads += 1
    finally:
        thread.join()
    return reads


def test_a_temp_name_already_taken_is_skipped_never_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temp names are pseudo-random: one that exists (even a symlink) is never opened; the
    writer draws another name, and the file in the way is left exactly as it was."""
    target = tmp_path / "MEMORY.md"
    taken = tmp_path / f".MEMORY.md.{0xAB:016x}.tmp"
    taken.symlink_to(tmp_path / "elsewhere")
    draws = iter([0xAB, 0xAB, 0xCD])
    monkeypatch.setattr(random, "getrandbits", lambda bits: next(draws))
    atomic_write_bytes(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert taken.is_symlink()
    assert not (tmp_path / "elsewhere").exists()
    assert next(draws, None) is None  # two taken draws skipped, the third used


def test_a_writer_that_only_draws_taken_names_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a few taken names in a row the write fails with FileExistsError, writing nothing."""
    (tmp_path / f".MEMORY.md.{0xAB:016x}.tmp").write_bytes(b"someone's")
    monkeypatch.setattr(random, "getrandbits", lambda bits: 0xAB)
    with pytest.raises(FileExistsError):
        atomic_write_bytes(tmp_path / "MEMORY.md", b"new\n")
    assert not (tmp_path / "MEMORY.md").exists()


def test_a_stale_temp_this_writer_may_not_remove_never_stops_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed writer's temp file owned by someone else (EPERM on unlink, as in a sticky
    directory) is left where it is; the write itself goes ahead."""
    foreign = tmp_path / f".MEMORY.md.{0xEE:016x}.tmp"
    foreign.write_bytes(b"another user's")
    real_unlink = os.unlink

    def unlink(path: str, *args: object, **kwargs: object) -> None:
        if os.fspath(path) == str(foreign):
            raise PermissionError(1, "Operation not permitted", str(path))
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", unlink)
    assert remove_stale_temps(tmp_path / "MEMORY.md") == []
    atomic_write_bytes(tmp_path / "MEMORY.md", b"new\n")
    assert (tmp_path / "MEMORY.md").read_bytes() == b"new\n"
    assert foreign.read_bytes() == b"another user's"


def _flushes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count fsync and fdatasync calls (and still make them)."""
    counts = {"fsync": 0, "fdatasync": 0}
    for name in counts:
        real = getattr(os, name)

        def counted(fd: int, name: str = name, real: Callable[[int], None] = real) -> None:
            counts[name] += 1
            real(fd)

        monkeypatch.setattr(os, name, counted)
    return counts


def test_append_adds_in_place_with_one_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append keeps the file (same inode, same mode), writes only the new bytes and flushes
    them with one fdatasync: no temp file, no rename (issue 15)."""
    target = tmp_path / "MEMORY.md"
    target.write_bytes(b"- first\n")
    target.chmod(0o600)
    inode = target.stat().st_ino
    flushes = _flushes(monkeypatch)
    seen: list[tuple[tuple[int, int], bytes]] = []
    appended = append_bytes(
        target, b"- first\n", b"- first\n- second\n",
        before_append=lambda will_be: seen.append((will_be, target.read_bytes())),
    )  # fmt: skip
    assert appended
    assert target.read_bytes() == b"- first\n- second\n"
    assert (target.stat().st_ino, stat.S_IMODE(target.stat().st_mode)) == (inode, 0o600)
    assert flushes == {"fsync": 0, "fdatasync": 1}
    # told what the file will be, before the bytes are in
    assert seen == [((inode, len(b"- first\n- second\n")), b"- first\n")]
    assert tree(tmp_path) == {"MEMORY.md"}


def _linked(target: Path) -> bytes:
    os.link(target, target.parent / "elsewhere")
    return target.read_bytes()


def _changed(target: Path) -> bytes:
    read = target.read_bytes()
    target.write_bytes(b"- a person's edit\n" + read)
    return read


def _network(target: Path) -> bytes:
    # As if on NFS (the test restores the cache).
    filesystems._known[target.stat().st_dev] = (time.monotonic(), False)
    return target.read_bytes()


def _symlink(target: Path) -> bytes:
    real = target.parent / "real.md"
    target.rename(real)
    target.symlink_to(real.name)
    return real.read_bytes()


@pytest.mark.parametrize(
    ("case", "prepare", "added"),
    [
        ("a hard link shared with another name", _linked, b"- new\n"),
        ("a file changed since it was read", _changed, b"- new\n"),
        ("a symlink", _symlink, b"- new\n"),
        ("a file on a network filesystem", _network, b"- new\n"),
        ("bytes that cross a page boundary", Path.read_bytes, b"x" * mmap.PAGESIZE),
    ],
)
def test_append_leaves_to_the_replace_what_it_cannot_do_in_place(
    tmp_path: Path,
    case: str,
    prepare: Callable[[Path], bytes],
    added: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing is written (False: the caller replaces) for a file shared through a hard link
    (written through, the other name would change), one that changed since it was read, a
    symlink, one on a network filesystem (a cut-off client can write a dead append back late),
    or an append a reader or a SIGKILL could see cut (across a page)."""
    monkeypatch.setattr(filesystems, "_known", {})
    target = tmp_path / "MEMORY.md"
    target.write_bytes(b"- first\n")
    current = prepare(target)
    on_disk = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert not append_bytes(target, current, current + added), case
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == on_disk


@pytest.mark.parametrize(
    ("current", "data"),
    [(None, b"new"), (b"abc", b"abc"), (b"abc", b"xbcd"), (b"abc", b"ab")],
)
def test_append_is_only_for_bytes_added_at_the_end(
    tmp_path: Path, current: bytes | None, data: bytes
) -> None:
    """No file read, nothing added, or a change before the end: not an append."""
    target = tmp_path / "MEMORY.md"
    target.write_bytes(b"abc")
    assert not append_bytes(target, current, data)
    assert target.read_bytes() == b"abc"


def test_a_failed_flush_is_undone_and_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fdatasync fails (EIO): the file is cut back to what it held, and the error raised, so
    the writer's "nothing was changed" is true."""
    target = tmp_path / "MEMORY.md"
    target.write_bytes(b"- first\n")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError, match="Input/output"):
        append_bytes(target, b"- first\n", b"- first\n- lost\n")
    assert target.read_bytes() == b"- first\n"


def test_an_append_never_overwrites_a_line_another_program_appended(tmp_path: Path) -> None:
    """A person's `echo >> MEMORY.md` landing between the read and the write (outside the
    lock) stays whole: the entry goes after it, never over it, and the intent is told again
    where the entry ended."""
    target = tmp_path / "MEMORY.md"
    target.write_bytes(b"- first\n")

    def someone_appends(_will_be: tuple[int, int]) -> None:
        with target.open("ab") as hand:
            hand.write(b"a hand line\n")

    told: list[tuple[int, int]] = []

    def told_then_someone_appends(will_be: tuple[int, int]) -> None:
        told.append(will_be)
        if len(told) == 1:
            someone_appends(will_be)

    added = append_bytes(
        target, b"- first\n", b"- first\n- entry\n", before_append=told_then_someone_appends
    )
    assert added
    assert target.read_bytes() == b"- first\na hand line\n- entry\n"
    # told again where the bytes really ended: a crash's intent names the file as it is
    inode = target.stat().st_ino
    assert told == [(inode, 16), (inode, 28)]


@pytest.mark.parametrize(
    ("meanwhile", "appended"),
    [
        (b"- first\na hand line\n", True),  # whole lines appended: the entry goes after them
        (b"- first\na hand li", False),  # a line being written: replaced from what was read
        (b"- FIRST\na hand line\n", False),  # changed, not appended to
    ],
)
def test_lines_appended_between_the_read_and_the_append_are_kept(
    tmp_path: Path, meanwhile: bytes, appended: bool
) -> None:
    """A person's `echo >>` between the writer's read (under its lock) and its open: the
    entry goes after the person's whole lines instead of a replace from what was read, which
    dropped them; anything else the file became is left to the replace, as before."""
    target = tmp_path / "MEMORY.md"
    target.write_bytes(meanwhile)
    told: list[tuple[int, int]] = []
    done = append_bytes(target, b"- first\n", b"- first\n- entry\n", before_append=told.append)
    assert done is appended
    if appended:
        assert target.read_bytes() == meanwhile + b"- entry\n"
        assert told == [(target.stat().st_ino, len(meanwhile) + 8)]
    else:
        assert target.read_bytes() == meanwhile


def test_an_append_to_a_file_replaced_during_the_write_fails(tmp_path: Path) -> None:
    """An editor's save (a new file renamed over it) between the open and the write: the bytes
    went to the file it replaced, so the append says it failed (ESTALE), and the editor's
    file is what stays."""
    target = tmp_path / "MEMORY.md"
    target.write_bytes(b"- first\n")

    def editor_saves(_will_be: tuple[int, int]) -> None:
        saved = tmp_path / "MEMORY.md~"
        saved.write_bytes(b"- first, edited\n")
        os.replace(saved, target)

    with pytest.raises(OSError, match="replaced by another program") as failed:
        append_bytes(target, b"- first\n", b"- first\n- entry\n", before_append=editor_saves)
    assert failed.value.errno == errno.ESTALE
    assert target.read_bytes() == b"- first, edited\n"


def test_a_reader_never_sees_part_of_an_append(tmp_path: Path) -> None:
    """While one thread adds entries of many lengths (in place where it may, else replacing),
    every read sees whole entries only: an append is never seen cut."""
    target = tmp_path / "MEMORY.md"
    target.write_bytes(b"")
    entry = re.compile(rb"(- x+\n)*")
    appended = 0

    def writer() -> None:
        nonlocal appended
        rng = random.Random(7)
        current = b""
        for _ in range(600):
            data = current + b"- " + b"x" * rng.randrange(1, 900) + b"\n"
            if append_bytes(target, current, data):
                appended += 1
            else:
                atomic_write_bytes(target, data)
            current = data

    assert _reads_while(writer, lambda: entry.fullmatch(target.read_bytes()) is not None) > 0
    assert appended > 300  # most went in place


@pytest.mark.parametrize(
    "flags", [os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.O_WRONLY | os.O_APPEND]
)
def test_open_regular_refuses_a_file_with_other_hard_links(tmp_path: Path, flags: int) -> None:
    """A hard link planted in a persona's directory names a file outside it: opened in place
    (truncated with O_TRUNC before anything was checked, or appended to), the outside file was
    changed. Refused (EMLINK, saying what to do), and the other file is untouched."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious\n")
    inside = tmp_path / "persona" / "log"
    inside.parent.mkdir()
    os.link(outside, inside)
    with pytest.raises(OSError, match="has 2 hard links") as caught:
        open_regular(inside, flags)
    assert caught.value.errno == errno.EMLINK
    assert outside.read_bytes() == b"precious\n"
