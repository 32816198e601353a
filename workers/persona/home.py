"""The persona home: which files make a soul, in what order, and how big they may get.

``compose_soul`` is a cross-port contract (docs/persona.md §1): the same directory must give the
same bytes in every language, so this module does exactly what the contract says and nothing clever:
bootstrap files in a fixed order, each as ``## NAME`` + blank line + its stripped body, joined by
blank lines. Two caps keep a runaway file from eating the context window:

* the per-file cap, in BYTES (2 MiB): a longer file is cut at a code-point boundary and a notice
  is appended, before the strip; the file on disk is never touched;
* the opt-in memory index cap, on MEMORY.md only, after the byte cap and before the strip: keep
  the longest run of whole leading lines within both bounds (a lone over-long first line is cut
  at a code-point boundary) and append a notice stating the CAP values. Off means byte-identical.

Reads are bounded (never more than ``MAX_FILE_BYTES + 1`` bytes per file); invalid UTF-8 is
decoded with replacement characters and logged (``soul.invalid_utf8``) rather than failing a turn.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from workers.persona.errors import PersonaFileError, PersonaNotFound
from workers.persona.files import read_inside

__all__ = [
    "BOOTSTRAP_ORDER",
    "DEFAULT_INDEX_CAP",
    "MAX_FILE_BYTES",
    "TRUNCATION_NOTICE",
    "CapSpec",
    "apply_index_cap",
    "compose_soul",
    "edited_since",
    "index_cap_notice",
    "persona_home",
    "resolve_index_cap",
]

#: Identity first, durable memory last. Part of the cross-port contract.
BOOTSTRAP_ORDER: tuple[str, ...] = (
    "AGENTS.md",
    "SOUL.md",
    "IDENTITY.md",
    "USER.md",
    "TOOLS.md",
    "HEARTBEAT.md",
    "MEMORY.md",
)
#: Per-file bootstrap cap, in bytes.
MAX_FILE_BYTES = 2 * 1024 * 1024
TRUNCATION_NOTICE = "\n[truncated: exceeds 2 MB bootstrap cap]"
#: What ``memory_index_cap=True`` means: (max_lines, max_bytes).
DEFAULT_INDEX_CAP: tuple[int, int] = (200, 25_600)
#: What callers pass as ``memory_index_cap``: off (None/False), the default (True), or explicit.
CapSpec = None | bool | tuple[int, int] | Mapping[str, int]

_MEMORY = "MEMORY.md"


def _log() -> Any:
    # Looked up per call (a rare path), so a logger cached by configuration never goes stale.
    return structlog.get_logger("soulfleet.soul")


def persona_home(path: str | os.PathLike[str]) -> Path:
    """The resolved persona directory; :class:`PersonaNotFound` if missing or not a directory."""
    if not os.fspath(path).strip():
        # Path("") is the working directory: a persona must be named, never assumed to be it.
        raise PersonaNotFound(repr(os.fspath(path)), "an empty path names no persona directory")
    home = Path(path).expanduser()
    try:
        resolved = home.resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError):
        raise PersonaNotFound(home) from None
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop
        raise PersonaNotFound(home, str(error)) from None
    if not resolved.is_dir():
        raise PersonaNotFound(home, "not a directory")
    return resolved


def resolve_index_cap(cap: object) -> tuple[int, int] | None:
    """``(max_lines, max_bytes)`` for a cap spec, or None when the cap is off.

    Raises ``TypeError``/``ValueError`` for anything else: a bad cap is a caller bug, not data.
    """
    if cap is None or cap is False:
        return None
    if cap is True:
        return DEFAULT_INDEX_CAP
    if isinstance(cap, Mapping):
        # The persona.toml form, { max_lines = 200, max_bytes = 25600 }, as README shows it.
        if set(cap) != {"max_lines", "max_bytes"}:
            raise TypeError(
                f"memory_index_cap as a mapping takes exactly max_lines and max_bytes, got {cap!r}"
            )
        cap = (cap["max_lines"], cap["max_bytes"])
    if not isinstance(cap, tuple) or len(cap) != 2:
        raise TypeError(
            "memory_index_cap must be None, a bool, (max_lines, max_bytes) or "
            f"{{'max_lines': ..., 'max_bytes': ...}}, got {cap!r}"
        )
    max_lines, max_bytes = cap
    for name, value in (("max_lines", max_lines), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"memory_index_cap {name} must be an int, got {value!r}")
        if value < 1:
            raise ValueError(f"memory_index_cap {name} must be >= 1, got {value}")
    return (max_lines, max_bytes)


def index_cap_notice(max_lines: int, max_bytes: int, *, notes: bool = False) -> str:
    """The notice appended to a capped MEMORY.md; it states the cap values, not the kept counts."""
    head = (
        f"\n[memory index truncated: MEMORY.md is capped at {max_lines} lines / {max_bytes} bytes"
    )
    if notes:
        return (
            f"{head}; keep MEMORY.md a short index and move details into note:<slug> files "
            "(memory tool: list, read)]"
        )
    return f"{head}; keep it short: replace or remove entries that no longer matter]"


def apply_index_cap(content: str, max_lines: int, max_bytes: int, *, notes: bool = False) -> str:
    """The memory index cap over MEMORY.md's (already byte-capped) content.

    A line ends at ``"\\n"`` or at the end of the content, and owns its ``"\\n"``: the byte
    bound counts newlines. Within both bounds the content comes back unchanged. Otherwise the
    longest run of whole leading lines within both bounds is kept (without its last newline, so
    the notice starts on the next line); if not even the first line fits, that line is cut at a
    code-point boundary; then the notice.
    """
    lines = content.split("\n")
    if content.endswith("\n"):
        lines.pop()
    if len(lines) <= max_lines and len(content.encode("utf-8")) <= max_bytes:
        return content
    kept: list[str] = []
    used = 0
    for line in lines[:max_lines]:
        # Every line but an unterminated last one carries its newline; that last one is never
        # reached here, since it fitting would mean the whole content fits.
        size = len(line.encode("utf-8")) + 1
        if used + size > max_bytes:
            break
        kept.append(line)
        used += size
    if kept:
        body = "\n".join(kept)
    else:
        # A valid line cut anywhere is valid UTF-8 but for a partial last character: drop it.
        body = lines[0].encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
    return body + index_cap_notice(max_lines, max_bytes, notes=notes)


#: (path, size, offset) of invalid UTF-8 already logged by this process: a bad file is
#: composed several times a command (the check-up, then the soul) and at every turn of a
#: worker; once is what an operator needs. Bounded: cleared when full.
_INVALID_SEEN: set[tuple[str, int, int]] = set()
_INVALID_SEEN_MAX = 4096


def _invalid_utf8(name: str, path: str, size: int, offset: int) -> None:
    seen = (path, size, offset)
    if seen in _INVALID_SEEN:
        return
    if len(_INVALID_SEEN) >= _INVALID_SEEN_MAX:
        _INVALID_SEEN.clear()
    _INVALID_SEEN.add(seen)
    _log().warning("soul.invalid_utf8", file=name, path=path, offset=offset)


def _section_body(name: str, home: str, raw: bytes) -> str:
    """The text of one bootstrap file from its first ``MAX_FILE_BYTES + 1`` bytes."""
    if len(raw) <= MAX_FILE_BYTES:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            _invalid_utf8(name, str(persona_home(home) / name), len(raw), error.start)
            return raw.decode("utf-8", "replace")
    path = str(persona_home(home) / name)
    _log().info("soul.truncated", file=name, path=path, cap_bytes=MAX_FILE_BYTES)
    raw = raw[:MAX_FILE_BYTES]
    # final=False drops a partial trailing character: right for a cut, and a dangling lead
    # byte before it is invalid data that "replace" below turns into U+FFFD anyway.
    try:
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(raw, final=False)
    except UnicodeDecodeError as error:
        _invalid_utf8(name, path, len(raw), error.start)
        text = codecs.getincrementaldecoder("utf-8")("replace").decode(raw, final=False)
    return text + TRUNCATION_NOTICE


def _section(name: str, body: str) -> str:
    """One bootstrap file's section of a soul (the contract's format)."""
    return f"## {name}\n\n{body.strip()}"


def _home_dir(path: str | os.PathLike[str]) -> str:
    """``path`` as a string naming a directory, without resolving it (one ``stat``): reading
    through the given path reads the same files as through its real one. Anything else goes
    to :func:`persona_home` for its precise error."""
    home = os.path.expanduser(os.fspath(path))
    try:
        if stat.S_ISDIR(os.stat(home).st_mode):
            return home
    except (OSError, ValueError):
        pass
    return str(persona_home(home))


def compose_soul(
    path: str | os.PathLike[str],
    memory_index_cap: CapSpec = None,
    notes: bool = False,
) -> tuple[str, list[str]]:
    """Compose the bootstrap files present in ``path`` into ``(soul, found)`` (docs/persona.md §1).

    Raises :class:`PersonaNotFound` for a missing directory and :class:`PersonaFileError` (naming
    the path) for a bootstrap name that is a directory, a dangling link or unreadable.
    """
    cap = resolve_index_cap(memory_index_cap)
    home = _home_dir(path)
    sections: list[str] = []
    found: list[str] = []
    for name in BOOTSTRAP_ORDER:
        try:
            raw = read_inside(home, name, MAX_FILE_BYTES)
        except PersonaFileError as error:
            # Errors name the file by its real path, as every reader of the home does.
            raise PersonaFileError(persona_home(home) / name, error.problem) from None
        if raw is None:
            continue
        body = _section_body(name, home, raw)
        if cap is not None and name == _MEMORY:
            body = apply_index_cap(body, cap[0], cap[1], notes=notes)
        sections.append(_section(name, body))
        found.append(name)
    return "\n\n".join(sections), found


#: The bootstrap files people edit; the persona writes MEMORY.md and USER.md itself, and its
#: session showing them as of its start is the contract ("memory shows up next session").
EDITED_BY_PEOPLE: tuple[str, ...] = tuple(
    name for name in BOOTSTRAP_ORDER if name not in (_MEMORY, "USER.md")
)


def edited_since(path: str | os.PathLike[str], soul: str) -> list[str]:
    """The bootstrap files people edit whose text now differs from their section of ``soul`` (a
    session's frozen soul, as :func:`compose_soul` made it): written, changed or removed since.
    The session goes on with the files as they were (contract: composed once, at session start)
    until it ends or is reset; this tells people so. A file that cannot be read now is left out
    (the next turn says why)."""
    home = _home_dir(path)
    current: dict[str, str | None] = {}
    for name in EDITED_BY_PEOPLE:
        try:
            raw = read_inside(home, name, MAX_FILE_BYTES)
        except PersonaFileError:
            continue
        current[name] = None if raw is None else _section(name, _section_body(name, home, raw))
    if _composes(soul, current):
        return []
    # Something differs: name what, section by section (a file whose text quotes another
    # file's header could make an absent file look present here; only then).
    frozen = _sections(soul)
    return [
        name
        for name, section in current.items()
        if (section is None and name in frozen)
        or (section is not None and not _whole(soul, section))
    ]


def _composes(soul: str, current: Mapping[str, str | None]) -> bool:
    """Whether ``soul`` is exactly what composing the files would give now, whatever USER.md and
    MEMORY.md (and a file unreadable now) held then: a left-to-right scan, where such a section's
    body runs to the next file's header (a body quoting a later header reads as changed)."""
    at = 0
    for index, name in enumerate(BOOTSTRAP_ORDER):
        gap = "\n\n" if at else ""
        if name in current:
            section = current[name]
            if section is None:
                continue
            if not soul.startswith(gap + section, at):
                return False
            at += len(gap) + len(section)
        elif soul.startswith(f"{gap}## {name}\n\n", at):
            later = [soul.find(f"\n\n## {n}\n\n", at + 1) for n in BOOTSTRAP_ORDER[index + 1 :]]
            at = min((n for n in later if n >= 0), default=len(soul))
    return at == len(soul)


def _whole(soul: str, section: str) -> bool:
    """Whether ``section`` is one whole section of ``soul`` (not a prefix of a longer one)."""
    at = soul.find(section)
    while at >= 0:
        end = at + len(section)
        if (at == 0 or soul[at - 2 : at] == "\n\n") and (
            end == len(soul) or soul.startswith("\n\n## ", end)
        ):
            return True
        at = soul.find(section, at + 1)
    return False


def _sections(soul: str) -> set[str]:
    """The file names whose ``## NAME`` header starts a section of ``soul`` (at its start, or
    after a blank line)."""
    return {
        name
        for name in BOOTSTRAP_ORDER
        if soul.startswith(f"## {name}\n\n") or f"\n\n## {name}\n\n" in soul
    }
