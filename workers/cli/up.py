"""``soulfleet up``: a whole fleet on this machine, in one command, stopped by Ctrl-C.

Start order: take the data directory's lock (a second ``up`` fails right here), pick the
personas (the demo on a first run), start the embedded Redis when REDIS_URL is unset (AOF on,
noeviction, a free loopback port, data in ``<data>/redis``), write ``up.json`` so other commands
find this fleet, then start the workers, beat and (``--flower``) Flower as supervised children,
and post the demo's welcome through the host API. Then it watches: surfaced beats from the
beats stream, events from the children's JSON logs, a status line every few seconds.

Stop order, on SIGINT, SIGTERM, SIGHUP (its terminal closed) or a write to its output that
fails (``soulfleet up | head``): beat, workers (warm shutdown with a deadline), Flower, and
Redis LAST, once nothing writes to it; then the state file and the lock. Exit 0. A child that
dies on its own is reported with the tail of its log, the rest are stopped the same way, and
``up`` exits 1. A second signal during shutdown kills what is left at once. If ``up`` itself is
SIGKILLed, the kernel kills its children (:mod:`workers.local.lifeline`), and any survivor
keeps the data folder locked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import secrets
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import click
import redis

from workers.cli.console import Console, StopRequest
from workers.cli.errors import EXIT_FAILURE, BadInputError, CliError
from workers.cli.group import DirectoryPath
from workers.cli.health import fixed_since, invalid_personas
from workers.cli.launch import (
    PersonasChoice,
    child_environ,
    child_specs,
    choose_personas,
    describe_personas,
    flower_auth,
    given_personas,
    metrics_line,
    missing_root,
    python_path,
)
from workers.cli.watch import LogTail, Reporter, follow_beats, live_status
from workers.fleet import Fleet
from workers.fleet.beats import Beat
from workers.fleet.errors import EvictingRedis, RedisUnavailable, is_auth_refusal
from workers.fleet.eviction import check_eviction_policy
from workers.fleet.persistence import warn_if_not_persistent
from workers.local.datadir import (
    AlreadyRunningError,
    DataDir,
    RootInUseError,
    UpLock,
    UpState,
    default_data_dir,
    lock_personas_root,
)
from workers.local.demo import WELCOME_PERSONA, welcome_text
from workers.local.redis_server import RedisServer, RedisServerError, free_port
from workers.local.supervisor import Child, Supervisor
from workers.persona.manifest import holds_persona
from workers.persona.shared_claims import check_hard_links
from workers.publisher import CeleryPublisher
from workers.settings import Settings, redact_url

__all__ = ["up"]

STATUS_EVERY = 10.0
#: A worker, beat or Flower that exits on its own is started again, at most this many times
#: within RESTART_WINDOW seconds; one that keeps failing stops `up`.
RESTARTS = 3
RESTART_WINDOW = 60.0
#: `up` runs one host's fleet: each worker keeps 200 turns in flight by default, so 32 is far
#: past what one host needs (`--workers 1000` had started 79 processes on 2 cores within 15 s).
MAX_WORKERS = 32
_TICK = 0.25


@click.command()
@click.option(
    "--personas",
    type=DirectoryPath(),
    default=None,
    help="Personas root (default: SOULFLEET_PERSONAS, else the demo personas).",
)
@click.option(
    "--workers",
    "worker_count",
    type=click.IntRange(min=1, max=MAX_WORKERS),
    default=1,
    show_default=True,
    help=f"celery worker processes (thread pool each; at most {MAX_WORKERS}).",
)
@click.option("--flower", is_flag=True, help="Also run Flower on 127.0.0.1.")
@click.option(
    "--data",
    type=DirectoryPath(),
    default=None,
    help="Data directory (default: $SOULFLEET_DATA, else $XDG_DATA_HOME/soulfleet, else "
    "~/.local/share/soulfleet). Other commands find this `up` through the same default: "
    "with --data, give them SOULFLEET_DATA=DIR.",
)
def up(personas: Path | None, worker_count: int, flower: bool, data: Path | None) -> None:
    """Run a fleet here: embedded Redis, workers, beat; stream its beats until Ctrl-C."""
    given = given_personas(personas, os.environ)
    if given is not None and not given.is_dir():  # before the data directory is made
        raise BadInputError(missing_root(given))
    if given is not None and holds_persona(given):
        # Its sessions/, transcripts/ and memory/ would each be scheduled as a persona.
        raise BadInputError(
            f"{given} looks like one persona's directory (it holds persona.toml or SOUL.md), "
            f"not a personas root: pass the folder that holds it (--personas {given.parent})"
        )
    data_dir = DataDir((data or default_data_dir()).expanduser().resolve())
    try:
        lock = data_dir.lock()
    except AlreadyRunningError as exc:
        raise CliError(str(exc)) from None
    stop = StopRequest()
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, stop.handle) for sig in handled}
    try:
        code = _Up(data_dir, personas, worker_count, flower, stop=stop, lock=lock).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        lock.release()
    if code:
        raise click.exceptions.Exit(code)


class _Up:
    """One `up` run: what it started, so whatever happens, it is all stopped in order."""

    def __init__(self, data: DataDir, personas: Path | None, workers: int, flower: bool, *,
                 stop: StopRequest, lock: UpLock) -> None:  # fmt: skip
        self.data, self.personas_option, self.workers, self.flower = data, personas, workers, flower
        self.stop = stop
        self.lock = lock
        #: The personas root's (:func:`lock_personas_root`), taken once the root is chosen.
        self.root_lock = UpLock(-1)
        self.redis: RedisServer | None = None
        # Every child inherits the locks: a survivor keeps a second `up` off this folder (and,
        # with the root's added once taken, off the personas root it serves).
        self.supervisor = Supervisor(keep_fds=(lock.fd,))
        self.fleet: Fleet | None = None
        self.publisher: CeleryPublisher | None = None
        self.console = Console(on_closed=stop.output_closed)
        self.reporter = Reporter(self.console.out)
        self.state: UpState | None = None
        self.restarts: dict[str, list[float]] = {}
        #: The status line could not be read (Redis away) and has not been since.
        self.redis_away = False

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self._shutdown()
            self.root_lock.release()  # last: its children hold it until they are gone

    def _hold_root(self, root: Path) -> None:
        """Take the personas root's lock, handed to every child started from now on."""
        if not root.is_dir():
            raise BadInputError(missing_root(root))
        try:
            self.root_lock = lock_personas_root(root.resolve())
        except RootInUseError as exc:
            raise CliError(str(exc)) from None
        if self.root_lock.is_locked:
            self.supervisor.keep_fds = (self.lock.fd, self.root_lock.fd)

    def _run(self) -> int:
        env = _checked_environ()
        with _writing(self.data.root):
            self.data.create()
            choice = choose_personas(self.personas_option, env, self.data.personas)
        # The demo root too: another `up --personas` may name it from another data folder.
        self._hold_root(choice.root)
        env["SOULFLEET_PERSONAS"] = str(choice.root)
        settings = Settings.from_env(env)  # invalid settings fail before anything starts
        echo = self.console.out
        echo(f"soulfleet up: data in {self.data.root}")
        if needed := other_shells(settings, self.data.root, choice.root, python_path(env)):
            echo(f"  other shells: {needed} soulfleet status")
        redis_url = self._redis_url(settings)
        env["REDIS_URL"] = redis_url
        settings = Settings.from_env(env)
        self.publisher = CeleryPublisher(settings)
        self.fleet = Fleet(settings, publisher=self.publisher)
        _reach(self.fleet, settings)
        try:  # the children would refuse one by one; say it once, before starting any
            check_eviction_policy(
                self.fleet.client, allow=settings.allow_eviction, url=redis_url, process="up"
            )
            warn_if_not_persistent(self.fleet.client, url=redis_url, process="up")
        except EvictingRedis as exc:
            raise CliError(str(exc)) from None
        if settings.lock_mode == "shared" and (problem := check_hard_links(choice.root)):
            raise CliError(f"{problem}: use SOULFLEET_LOCK_MODE=local there (one host)")
        served = self.fleet.served_root()
        if served is not None and served != choice.root.resolve():
            # Lanes are named by persona: a same-named persona under the new root would carry
            # on the old one's sessions pointer, spend and dead letters.
            echo(f"  WARNING   this Redis last served personas from {served}, not {choice.root}: "
                 "same-named personas share their lane state (sessions, today's spend, dead "
                 "letters); use another --data for a separate fleet")  # fmt: skip
        lanes = self._describe(choice, settings)
        state = UpState(
            pid=os.getpid(), redis_url=self._recorded_url(redis_url), personas=str(choice.root),
            key_prefix=settings.key_prefix, queue_prefix=settings.queue_prefix,
            data=str(self.data.root), started_at=time.time(), embedded_redis=self.redis is not None,
            children=self._child_pids(),
            mcp_config=str(settings.mcp_config.resolve()) if settings.mcp_config else "",
            python_path=python_path(env),
        )  # fmt: skip
        with _writing(self.data.root):
            self.data.write_state(state)
        flower_port = free_port() if self.flower else 0
        auth, auth_note = flower_auth(env, self.data.flower_auth) if self.flower else ("", "")
        specs = child_specs(settings, child_environ(env, redis_url=redis_url, personas=choice.root),
                            logs=self.data.logs, cwd=self.data.root, workers=self.workers,
                            flower=self.flower, flower_port=flower_port,
                            flower_auth=auth or None)  # fmt: skip
        tails = [LogTail.at_end(spec.log_path, spec.name) for spec in specs]
        for spec in specs:
            if self.stop.requested.is_set():
                return 0
            self.supervisor.start(spec)
        self.state = state
        with _writing(self.data.root):
            self.data.write_state(dataclasses.replace(state, children=self._child_pids()))
        echo(f"  children  {len(specs)} processes: {', '.join(s.name for s in specs)}; "
             f"logs in {self.data.logs}")  # fmt: skip
        if self.flower:
            echo(f"  flower    http://127.0.0.1:{flower_port}/ ({auth_note})")
        echo(f"  metrics   {metrics_line(specs, settings.metrics_host)}")
        echo("Ctrl-C stops everything.")
        # Once, when the demo is copied: on every start it piled one more identical
        # `remember:` line into nora's MEMORY.md.
        if choice.demo and WELCOME_PERSONA in choice.installed:
            text = welcome_text()
            self.fleet.post(WELCOME_PERSONA, text, sender="soulfleet-up", channel="cli")
            self.reporter.line("posted", f"{WELCOME_PERSONA} <- {text!r} (Fleet.post)")
        return self._watch(tails, lanes)

    def _recorded_url(self, redis_url: str) -> str:
        """What up.json says of the Redis: never a password (the embedded one's is in
        redis.url, owner-only)."""
        return self.redis.public_url if self.redis is not None else redact_url(redis_url)

    def _redis_url(self, settings: Settings) -> str:
        """REDIS_URL when set, else an embedded Redis started now (it dies with `up`)."""
        echo = self.console.out
        if settings.redis_url_explicit:
            echo(f"  redis     {redact_url(settings.redis_url)} (REDIS_URL)")
            return settings.redis_url
        try:
            self.redis = RedisServer(
                self.data.redis,
                persistent=True,
                keep_fds=(self.lock.fd,),
                parent_death_signal=signal.SIGTERM,  # flush the AOF, then exit
                # Any local user could reach a loopback port: read every inbox, post items
                # marked trusted. A new password each run; other commands read redis.url.
                password=secrets.token_urlsafe(24),
            ).start()
        except RedisServerError as exc:
            raise CliError(f"embedded Redis did not start: {exc}") from exc
        with _writing(self.data.root):
            self.data.write_redis_url(self.redis.url)
        echo(f"  redis     embedded {self.redis.binary} {self.redis.version} at "
             f"{self.redis.public_url} (password in {self.data.redis_url_path}; AOF on, "
             f"noeviction; data in {self.data.redis})")  # fmt: skip
        return self.redis.url

    def _describe(self, choice: PersonasChoice, settings: Settings) -> int:
        """Print the personas (and dead lanes a fix made runnable); return the lane count."""
        assert self.fleet is not None
        echo = self.console.out
        how = (
            "demo personas, copied on this first run"
            if choice.installed
            else "the data folder's personas root, where the demo personas were copied"
        )
        echo(f"  personas  {choice.root} ({how if choice.demo else 'yours'})")
        lines, lanes = describe_personas(choice.root, settings)
        for line in lines or ["(no persona directories here yet: `soulfleet init DIR` makes one)"]:
            echo(f"    {line}")
        fixed = fixed_since(self.fleet, settings.model, invalid=invalid_personas(self.fleet),
                            mcp_servers=settings.mcp_servers)  # fmt: skip
        if fixed:
            echo(f"  dead      {len(fixed)} lane(s) dead-lettered by their files or settings (a "
                 "configuration error, a persona directory gone), which are fine now "
                 f"({', '.join(lane for lane, _ in fixed)}): `soulfleet revive --all` takes them "
                 "back")  # fmt: skip
        return lanes

    def _watch(self, tails: list[LogTail], lanes: int) -> int:
        assert self.fleet is not None
        beats: queue.Queue[Beat | Exception] = queue.Queue()
        stop_beats = threading.Event()
        follower = threading.Thread(target=follow_beats, args=(self.fleet, beats, stop_beats),
                                    name="beats-follow", daemon=True)  # fmt: skip
        follower.start()
        next_status = time.monotonic() + STATUS_EVERY
        try:
            while not self.stop.requested.is_set():
                for tail in tails:
                    self.reporter.events(tail.read())
                self._drain(beats)
                if self.redis is not None and not self._redis_running():
                    return EXIT_FAILURE
                crashed = self.supervisor.crashed()
                if crashed is not None and not self._restarted(crashed):
                    return EXIT_FAILURE
                if time.monotonic() >= next_status:
                    next_status += STATUS_EVERY
                    self._status(lanes)
                self.stop.requested.wait(_TICK)
            return 0
        finally:
            stop_beats.set()
            for tail in tails:  # what the children said while we were stopping the loop
                self.reporter.events(tail.read())
            follower.join(timeout=3)

    def _status(self, lanes: int) -> None:
        """The status line; a Redis that does not answer is said once, and when it answers
        again, and never stops `up`: its workers and beat reconnect by themselves (an embedded
        Redis that exited is :meth:`_redis_running`'s, which stops the fleet)."""
        assert self.fleet is not None
        try:
            live_status(self.reporter, self.fleet, lanes)
        except (RedisUnavailable, redis.RedisError) as exc:
            if not self.redis_away:
                self.reporter.line(
                    "error",
                    f"status unavailable: {exc}. The fleet's workers and beat reconnect by "
                    "themselves once Redis answers; `up` goes on (Ctrl-C stops the fleet)",
                )
            self.redis_away = True
            return
        if self.redis_away:
            self.redis_away = False
            self.reporter.line("status", "Redis answers again")

    def _restarted(self, crashed: Child) -> bool:
        """Report a child that exited on its own and start it again, unless it has already
        been restarted :data:`RESTARTS` times within :data:`RESTART_WINDOW` seconds (then it
        keeps failing, and `up` stops: False)."""
        now = time.monotonic()
        recent = [at for at in self.restarts.get(crashed.name, []) if now - at < RESTART_WINDOW]
        code = crashed.popen.returncode
        if len(recent) >= RESTARTS:
            self.reporter.line(
                "error",
                f"{crashed.name} exited unexpectedly (code {code}) for the {len(recent) + 1}th "
                f"time within {RESTART_WINDOW:.0f}s; stopping. Last log lines:",
            )
            self.console.err(crashed.log_tail())
            return False
        self.reporter.line(
            "error",
            f"{crashed.name} exited unexpectedly (code {code}); restarting it "
            f"({len(recent) + 1} of {RESTARTS} restarts allowed within {RESTART_WINDOW:.0f}s; "
            "its turns are re-run by the fleet). Last log lines:",
        )
        self.console.err(crashed.log_tail())
        self.supervisor.restart(crashed)
        self.restarts[crashed.name] = [*recent, now]
        self._record_children(crashed.name)
        return True

    def _record_children(self, restarted: str) -> None:
        """Rewrite up.json with the children's pids after a restart. They only name survivors
        for a second `up`: a file that cannot be written (a full disk) is said, and is never a
        reason to stop a running fleet."""
        if self.state is None:
            return
        try:
            self.data.write_state(dataclasses.replace(self.state, children=self._child_pids()))
        except OSError as exc:
            self.reporter.line(
                "error",
                f"could not record {restarted}'s new pid in {self.data.state_path} "
                f"({exc.strerror or exc}); the fleet runs on (other commands still find it "
                "there); free space on that disk",
            )

    def _child_pids(self) -> tuple[int, ...]:
        redis = self.redis.process.pid if self.redis and self.redis.process else None
        return tuple(pid for pid in (redis, *self.supervisor.pids()) if pid is not None)

    def _redis_exit(self) -> int | None:
        """The embedded Redis's exit code once it has exited; None while it runs (or none)."""
        process = self.redis.process if self.redis is not None else None
        return None if process is None else process.poll()

    def _redis_running(self) -> bool:
        code = self._redis_exit()
        if code is None:
            return True
        assert self.redis is not None
        self.reporter.line("error", f"the embedded redis-server exited unexpectedly (code "
                           f"{code}; see {self.redis.log_path}): stopping the fleet, "
                           "which cannot run without it; `soulfleet up` again restarts it on the "
                           "same data (the AOF keeps all but at most its last second of "
                           "writes)")  # fmt: skip
        return False

    def _drain(self, beats: queue.Queue[Beat | Exception]) -> None:
        while True:
            try:
                item = beats.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Exception):
                if self._redis_exit() is not None:
                    # Its generic advice (set REDIS_URL, start `soulfleet up`) is wrong here:
                    # the line about the embedded Redis says what happened.
                    self.reporter.line("error", "beats feed stopped: the embedded Redis is gone")
                else:
                    self.reporter.line("error", f"beats feed interrupted: {item}; it resumes "
                                       "where it stopped once Redis answers")  # fmt: skip
            else:
                self.reporter.beat(item)

    def _shutdown(self) -> None:
        started = bool(self.supervisor.children) or self.redis is not None
        if self.supervisor.children:
            flower = any(child.name == "flower" for child in self.supervisor.children)
            order = "beat, then workers (warm shutdown)" + (", then flower" if flower else "")
            self.console.err(f"stopping: {order}...")
            stopped = self.supervisor.stop_all(
                force=self.stop.force, should_force=lambda: self.stop.force
            )
            for name, code in stopped:
                self.console.err(f"  {name} stopped (exit {code})")
        if self.publisher is not None:
            self.publisher.close()
        if self.fleet is not None:
            self.fleet.client.close()
        if self.redis is not None:
            code = self._redis_exit()
            stopped_with = self.redis.stop()
            if code is not None:
                self.console.err(f"  redis had already exited (code {code}): "
                                 "at most its last second of writes is lost")  # fmt: skip
            elif stopped_with == 0:
                self.console.err("  redis stopped (AOF flushed)")
            else:
                self.console.err(
                    f"  redis did not shut down cleanly (exit {stopped_with}): its last writes "
                    f"may not be on disk (a full disk?); see {self.redis.log_path}"
                )
        self.data.clear_state(os.getpid())
        if started:
            self.console.err("soulfleet up: stopped.")


@contextlib.contextmanager
def _writing(data: Path) -> Iterator[None]:
    """A write into the data folder that fails (a full disk, a read-only mount) is named with
    that folder: the bare OSError of a write ("[Errno 28] No space left on device") said
    neither which folder nor what to do."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise CliError(
            f"cannot write the data folder {data}{where}: {exc.strerror or exc}; free space "
            "there (or make it writable), or pass another --data directory"
        ) from exc


def _reach(fleet: Fleet, settings: Settings) -> None:
    """Fail unless the fleet's Redis answers; a configured one that does not is named."""
    try:
        fleet.ping()
    except RedisUnavailable as exc:
        if not settings.redis_url_explicit:
            raise
        # The generic advice ("start one with `soulfleet up`") is circular here.
        why = f" ({exc.detail})" if exc.detail else ""
        todo = (
            "it refused the credentials: check the password (and user) in REDIS_URL"
            if is_auth_refusal(exc.detail)
            else "start that Redis"
        )
        raise CliError(
            f"Redis at {exc.url} (REDIS_URL) is unavailable{why}: {todo}, or unset REDIS_URL "
            "and `soulfleet up` runs an embedded one"
        ) from None


def _checked_environ() -> dict[str, str]:
    """This process's environment, its settings checked: invalid ones fail before anything is
    written (the demo personas copied by a start that then refused a setting made the next,
    real first start skip nora's welcome)."""
    env = dict(os.environ)
    Settings.from_env(env)
    return env


def other_shells(
    settings: Settings, data: Path, personas: Path, python_path: tuple[str, ...] = ()
) -> str | None:
    """The environment another shell needs to reach this fleet; None when it needs nothing.

    With the embedded Redis, other commands find a running ``up`` through its data dir (only
    the default one unless told: SOULFLEET_DATA), and with it the MCP config and PYTHONPATH
    its workers were given. On a Redis of the user's own they find it only through what it was
    started with (a prefix left out posts to a queue no worker reads; without the MCP config
    or PYTHONPATH, a persona's tools are checked against what that shell has); REDIS_URL is
    printed only when it holds no password, and a data dir other than the default is named
    (it is how a shell finds this `up`'s MCP config and PYTHONPATH)."""
    if not settings.redis_url_explicit:
        if data == default_data_dir().expanduser().resolve():
            return None
        return f"SOULFLEET_DATA={shlex.quote(str(data))}"
    default = Settings()
    url = settings.redis_url
    if redact_url(url) == url:  # no password in it: the line can be pasted as it is
        parts = [f"REDIS_URL={shlex.quote(url)}"]
    else:
        parts = ['REDIS_URL="<the URL given to this up; not printed: it holds a password>"']
    if settings.key_prefix != default.key_prefix:
        parts.append(f"SOULFLEET_KEY_PREFIX={shlex.quote(settings.key_prefix)}")
    if settings.queue_prefix != default.queue_prefix:
        parts.append(f"SOULFLEET_QUEUE_PREFIX={shlex.quote(settings.queue_prefix)}")
    parts.append(f"SOULFLEET_PERSONAS={shlex.quote(str(personas))}")
    if data != default_data_dir().expanduser().resolve():
        parts.append(f"SOULFLEET_DATA={shlex.quote(str(data))}")
    if settings.mcp_config:
        parts.append(f"SOULFLEET_MCP_CONFIG={shlex.quote(str(settings.mcp_config.resolve()))}")
    if python_path:
        parts.append(f"PYTHONPATH={shlex.quote(os.pathsep.join(python_path))}")
    return " ".join(parts)
