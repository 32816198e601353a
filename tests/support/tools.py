"""The two outside programs the ops tests run, found on PATH or fetched once into a cache, as
the suite fetches redis-server: so the README's test command needs nothing installed first.

- ``docker-compose`` (validates docker-compose.yml; no Docker engine needed): when missing,
  docker-compose 1.29.2 (the version Debian ships) from PyPI into a venv of its own. Its
  declared PyYAML<6 has no wheel for current Pythons and no longer builds, so it is installed
  without its pins, beside current versions of what it imports (checked by running it).
- ``promtool`` (checks the Prometheus config and alert rules, runs their unit tests): when
  missing, taken out of Debian's ``prometheus`` package (``apt-get download``, ``dpkg-deb
  -x``: no root needed) on a Debian-family system; elsewhere the test says what to install.

The cache is ``$XDG_CACHE_HOME/soulfleet-tests`` (``~/.cache`` by default); a half-built entry
(no ``.ready`` marker) is built again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["ToolMissing", "docker_compose", "promtool"]

COMPOSE_VERSION = "1.29.2"
#: What docker-compose 1.29.2 imports, at versions that install on current Pythons.
COMPOSE_IMPORTS = (
    "PyYAML>=6", "docker>=5", "dockerpty", "docopt", "jsonschema<4", "python-dotenv",
    "texttable", "websocket-client", "distro", "requests", "setuptools",
)  # fmt: skip


class ToolMissing(RuntimeError):
    """A tool is not on PATH and could not be fetched: the message says what to install."""


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "soulfleet-tests"


@contextmanager
def _locked(name: str) -> Iterator[Path]:
    """The cache entry ``name``, built by one process at a time."""
    cache = _cache()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield cache / name


def _run(argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise ToolMissing(f"{' '.join(argv)} failed: {(done.stdout + done.stderr)[-1500:]}")
    return done.stdout


def docker_compose() -> str:
    """The path of a docker-compose (v1, the Python one) to validate docker-compose.yml with."""
    found = shutil.which("docker-compose")
    if found is not None:
        return found
    with _locked(f"docker-compose-{COMPOSE_VERSION}") as venv:
        binary = venv / "bin" / "docker-compose"
        if not (venv / ".ready").exists():
            shutil.rmtree(venv, ignore_errors=True)
            try:
                _run([sys.executable, "-m", "venv", str(venv)])
                pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
                _run([*pip, "--no-deps", f"docker-compose=={COMPOSE_VERSION}"])
                _run([*pip, *COMPOSE_IMPORTS])
                _run([str(binary), "version"])
            except (ToolMissing, OSError, subprocess.TimeoutExpired) as exc:
                raise ToolMissing(
                    f"docker-compose is not on PATH and could not be installed from PyPI "
                    f"({exc}); install it (apt-get install --no-install-recommends "
                    "docker-compose)"
                ) from exc
            (venv / ".ready").touch()
    return str(binary)


def promtool() -> str:
    """The path of a promtool to check the Prometheus config and rules with."""
    found = shutil.which("promtool")
    if found is not None:
        return found
    with _locked("prometheus-deb") as root:
        binary = root / "usr" / "bin" / "promtool"
        if not (root / ".ready").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            try:
                _run(["apt-get", "download", "prometheus"], cwd=root)
                (deb,) = root.glob("prometheus_*.deb")
                _run(["dpkg-deb", "-x", str(deb), str(root)])
                deb.unlink()
                _run([str(binary), "--version"])
            except (ToolMissing, OSError, ValueError, subprocess.TimeoutExpired) as exc:
                raise ToolMissing(
                    f"promtool is not on PATH and could not be taken from Debian's prometheus "
                    f"package ({exc}); install Prometheus's promtool (Debian/Ubuntu: apt-get "
                    "install --no-install-recommends prometheus)"
                ) from exc
            (root / ".ready").touch()
    return str(binary)
