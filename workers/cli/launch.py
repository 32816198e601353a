"""The pieces ``soulfleet up`` assembles: personas root, child environment, child commands.

Kept apart from the command so each piece is a plain function a test can call:

- :func:`choose_personas`: ``--personas``, else ``SOULFLEET_PERSONAS``, else the demo copied
  into ``<data>/personas`` (first run only; a user's edits are never overwritten);
- :func:`child_environ`: what every child gets — REDIS_URL of the fleet, the personas root,
  JSON logs (``up`` reads them), and distinct metrics ports only when the user set a base;
- :func:`child_specs`: ``celery -A workers worker`` x N (thread pool), ``celery -A workers
  beat``, and ``celery -A workers flower`` on 127.0.0.1 — with their shutdown stages (beat
  first, workers next with a warm-shutdown deadline, Flower last);
- :func:`describe_personas`: one line per persona saying which model it uses and its
  schedules, so nobody wonders whether the demo is calling a paid API.

Children run ``sys.executable -m celery``: the interpreter ``up`` runs in, whatever PATH says.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.cli.errors import CliError
from workers.fleet.errors import UnusablePersonaName
from workers.fleet.registry import PersonaRegistry
from workers.local.demo import install_demo
from workers.local.supervisor import ChildSpec
from workers.persona.checkup import check_persona
from workers.persona.errors import ModelSpecError, PersonaError, ToolSetupSlow
from workers.queues import KINDS, queue_name
from workers.settings import Settings

__all__ = [
    "BUILTIN_MODEL_LABEL",
    "PersonasChoice",
    "child_environ",
    "child_specs",
    "choose_personas",
    "describe_personas",
    "flower_auth",
    "given_personas",
    "metrics_line",
    "missing_root",
    "model_label",
    "python_path",
]

BUILTIN_MODEL_LABEL = "scripted:builtin (the built-in scripted model: offline, no API key)"
#: A warm shutdown lets running turns commit; past this a worker is killed and its lanes'
#: leases expire, so the reaper re-queues those turns (nothing is lost, they are retried).
WORKER_STOP_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class PersonasChoice:
    root: Path
    demo: bool  # the packaged demo (in <data>/personas), not the user's own personas
    installed: tuple[str, ...] = ()  # demo personas copied on this run


def given_personas(option: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The personas root ``--personas`` or ``SOULFLEET_PERSONAS`` names; None for neither (the
    demo personas under the data directory)."""
    if option is not None:
        return option.expanduser().resolve()
    configured = (environ.get("SOULFLEET_PERSONAS") or "").strip()
    return Path(configured).expanduser().resolve() if configured else None


def missing_root(root: Path) -> str:
    return (
        f"personas root {root} does not exist (--personas or SOULFLEET_PERSONAS; "
        "`soulfleet init DIR/<name>` makes a persona)"
    )


def choose_personas(
    option: Path | None, environ: Mapping[str, str], data_personas: Path
) -> PersonasChoice:
    given = given_personas(option, environ)
    if given is not None:
        return PersonasChoice(given, demo=False)
    installed = install_demo(data_personas)
    return PersonasChoice(data_personas.resolve(), demo=True, installed=tuple(installed))


def python_path(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``PYTHONPATH``'s entries made absolute, as `up`'s children get them (they run in the
    data directory; ``""`` is the current directory: `up`'s, not theirs)."""
    raw = environ.get("PYTHONPATH") or ""
    return tuple(str(Path(entry).absolute()) for entry in raw.split(os.pathsep)) if raw else ()


def child_environ(environ: Mapping[str, str], *, redis_url: str, personas: Path) -> dict[str, str]:
    """The environment every child starts from (per-child metrics ports are added later).

    The children run in the data directory: a relative SOULFLEET_MCP_CONFIG or PYTHONPATH
    entry, meant from where `up` was started, is made absolute (the workers found no MCP
    config, or could not import a persona's Python tool)."""
    env = dict(environ)
    mcp = (env.get("SOULFLEET_MCP_CONFIG") or "").strip()
    if mcp:
        env["SOULFLEET_MCP_CONFIG"] = str(Path(mcp).expanduser().absolute())
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(python_path(env))
    env.update(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_PERSONAS": str(personas),
            "SOULFLEET_LOG_FORMAT": "json",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _metrics_env(env: Mapping[str, str], base: int, offset: int) -> dict[str, str]:
    child = dict(env)
    # One port per process: two processes cannot serve /metrics on the same port.
    child["SOULFLEET_METRICS_PORT"] = str(base + offset) if base > 0 else "0"
    return child


def child_specs(
    settings: Settings,
    env: Mapping[str, str],
    *,
    logs: Path,
    cwd: Path,
    workers: int,
    flower: bool,
    flower_port: int = 5555,
    flower_auth: str | None = None,
) -> list[ChildSpec]:
    if flower:
        # Flower shows only what task events tell it; they are off by default (they cost turns).
        env = {**env, "SOULFLEET_TASK_EVENTS": "1"}
    celery = [sys.executable, "-m", "celery", "-A", "workers"]
    queues = ",".join(queue_name(settings.queue_prefix, kind) for kind in KINDS)
    base = settings.metrics_port
    specs = [
        ChildSpec(
            name=f"worker-{i}",
            argv=[
                *celery,
                "worker",
                "-n",
                f"worker{i}.{settings.queue_prefix}@%h",
                "-Q",
                queues,
                "-P",
                settings.worker_pool,
                "-c",
                str(settings.worker_concurrency),
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "INFO",
            ],
            env=_metrics_env(env, base, i - 1),
            log_path=logs / f"worker-{i}.log",
            cwd=cwd,
            stage=1,
            stop_timeout=WORKER_STOP_TIMEOUT,
        )
        for i in range(1, workers + 1)
    ]
    # beat stops FIRST: no new ticks while workers drain.
    specs.insert(
        0,
        ChildSpec(
            name="beat",
            argv=[*celery, "beat", "--loglevel", "INFO"],
            env=_metrics_env(env, base, workers),
            log_path=logs / "beat.log",
            cwd=cwd,
            stage=0,
        ),
    )
    if flower:
        specs.append(
            ChildSpec(
                name="flower",
                argv=[*celery, "flower", "--address=127.0.0.1", f"--port={flower_port}"],
                env={
                    **_metrics_env(env, 0, 0),
                    **({"FLOWER_BASIC_AUTH": flower_auth} if flower_auth else {}),
                },
                log_path=logs / "flower.log",
                cwd=cwd,
                stage=2,
                stop_signal=signal.SIGTERM,
            )
        )
    return specs


def metrics_line(specs: list[ChildSpec], host: str) -> str:
    """Where each child serves /metrics, or how to turn metrics on."""
    served = []
    for spec in specs:
        port = spec.env.get("SOULFLEET_METRICS_PORT", "0")
        if port in ("", "0"):
            continue
        url = f"{spec.name} http://{host}:{port}/metrics"
        if _port_taken(host, int(port)):
            # Said here, before the child fails to bind it: the URL would show another
            # process's metrics (another fleet's) as this one's.
            url += " (PORT IN USE by another process: this child serves no metrics; set "
            url += "SOULFLEET_METRICS_PORT to a free range)"
        served.append(url)
    if not served:
        return "off (SOULFLEET_METRICS_PORT=9100 serves /metrics on 9100 and up, one per process)"
    return ", ".join(served)


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As the metrics server binds: a port whose last connections are only in TIME_WAIT (a
        # scrape just before a restart) is free to it, and so not "in use".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


FLOWER_USER = "soulfleet"


def flower_auth(environ: Mapping[str, str], secret_file: Path) -> tuple[str, str]:
    """Flower's basic auth and how to tell the user where it is (never the password itself).

    ``FLOWER_BASIC_AUTH`` (``user:password``) when set; else a password generated once per data
    folder, kept in ``secret_file`` (mode 0600): Flower's API refuses requests without auth,
    and a local dashboard should not be open to every process on the machine either.
    """
    configured = (environ.get("FLOWER_BASIC_AUTH") or "").strip()
    if configured:
        return configured, "basic auth from FLOWER_BASIC_AUTH"
    try:
        return _flower_secret(secret_file)
    except OSError as exc:
        raise CliError(
            f"cannot use the Flower password file {secret_file}: {exc.strerror or exc} (it must "
            "be a regular file of this user's, not a symlink); remove it and start again, or "
            "set FLOWER_BASIC_AUTH=user:password"
        ) from exc


def _flower_secret(secret_file: Path) -> tuple[str, str]:
    """The stored ``user:password`` (made now if there is none), owner-only; never through a
    symlink (O_NOFOLLOW: a link planted at its name cannot redirect the write or the chmod)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(secret_file, flags, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        # O_CREAT's mode applies to a new file only: one already there keeps its own.
        os.fchmod(handle.fileno(), 0o600)
        stored = handle.read().strip()
        if ":" not in stored:
            stored = f"{FLOWER_USER}:{secrets.token_urlsafe(18)}"
            handle.seek(0)
            handle.truncate()
            handle.write(stored + "\n")
    user = stored.split(":", 1)[0]
    return stored, f"user {user}, password in {secret_file}"


def model_label(spec: str, settings: Settings) -> str:
    """What model a persona with ``model = spec`` uses, in words (never contacts a provider)."""
    chosen = spec.strip()
    if chosen.lower() in ("", "inherit"):
        default = settings.model.default_spec.strip()
        if default.lower() in ("", "inherit"):
            return BUILTIN_MODEL_LABEL
        return f"{default} (SOULFLEET_MODEL)"
    if chosen == "scripted:builtin":
        return BUILTIN_MODEL_LABEL
    return f"{chosen} (persona.toml)"


def _every(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def describe_personas(root: Path, settings: Settings) -> tuple[list[str], int]:
    """One line per persona (model, schedules) and how many lanes the fleet has."""
    registry = PersonaRegistry(root)
    names = registry.names()
    width = max((len(name) for name in names), default=0)
    lines: list[str] = []
    lanes = 0
    for name in names:
        try:
            checkup = check_persona(
                registry.home(name),
                settings.model,
                mcp_servers=settings.mcp_servers,
                turn_max_tokens=settings.turn_max_tokens,
            )
        except ToolSetupSlow as exc:  # transient (beat does not call it invalid): retried
            lines.append(
                f"{name:<{width}}  tools still setting up: {' '.join(str(exc).split())}; its "
                "turns are retried until that finishes"
            )
            lanes += 1
            continue
        except (PersonaError, ModelSpecError, ValueError) as exc:
            lines.append(f"{name:<{width}}  INVALID: {' '.join(str(exc).split())}")
            lanes += 1
            continue
        agent = checkup.agent
        lanes += 2 if agent.dream else 1
        parts = [f"model {model_label(agent.model, settings)}"]
        if agent.heartbeat:
            beat = f"heartbeat every {_every(agent.heartbeat.every)}"
            hours = agent.heartbeat.active_hours
            if hours is not None and hours.start != hours.end:  # silent outside: say when
                beat += f" from {hours.start:%H:%M} to {hours.end:%H:%M} {hours.timezone}"
            parts.append(beat)
        if agent.dream:
            dream = agent.dream
            when = (
                f"every {_every(dream.every)}"
                if dream.every
                else f"cron {dream.cron!r} {dream.timezone}"
            )
            parts.append(f"dream {when}")
        # Each warning as the check words it (an empty soul, a soul over the token budget, a
        # model key this shell lacks): one label for all of them had named the wrong problem.
        parts += [f"WARNING: {' '.join(warning.split())}" for warning in checkup.warnings]
        lines.append(f"{name:<{width}}  " + "; ".join(parts))
    for skipped in registry.unusable_names():
        lines.append(f"{skipped!r}  SKIPPED: {UnusablePersonaName(skipped, root)}")
    return lines, lanes
