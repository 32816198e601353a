"""Which fleet a CLI command talks to, and how it reaches it.

Resolution, first that applies (the README's "Which fleet" section says the same):

- ``REDIS_URL`` set: that Redis, always (an explicit setting is never second-guessed);
- else a ``soulfleet up`` running on the DEFAULT data directory: its embedded Redis, key and
  queue prefixes and personas root, read from its ``up.json`` — so ``soulfleet post ava hi``
  next to a running ``up`` just works;
- else NO fleet: the command exits 2 with "no fleet is running: start one with `soulfleet up`,
  or set REDIS_URL". It never guesses an address: a Redis that happens to listen on
  127.0.0.1:6379 is someone else's as often as not, and writing into it would "succeed".

The personas root is ``--personas`` if given, else ``SOULFLEET_PERSONAS``, else the running
``up``'s, else the one the fleet's workers serve (recorded in its Redis by beat), else
``./personas``.

Turns are published by :class:`workers.publisher.CeleryPublisher` with a Celery app built from THIS
command's settings, not ``workers.celery.app`` (configured from ``os.environ`` at import): a CLI
command may be talking to the fleet found in ``up.json``, whose broker the environment does not
name.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import unicodedata
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import click
import redis

from workers.cli.beat_health import beat_seen
from workers.cli.errors import BadInputError, CliError
from workers.cli.launch import python_path
from workers.cli.stall import StallNotice, watched_client
from workers.fleet import Fleet
from workers.fleet.clients import fleet_client
from workers.fleet.door_settings import fleet_lock_mode, fleet_models, with_fleet_settings
from workers.fleet.errors import FleetError, RedisUnavailable, UnknownPersona, UnusablePersonaName
from workers.fleet.keys import Keys
from workers.fleet.registry import DREAMER_SUFFIX, PersonaRegistry, valid_persona_name
from workers.local.datadir import DataDir, UpState, default_data_dir
from workers.persona import storage
from workers.persona.checkup import check_persona
from workers.persona.errors import (
    PersonaConfigError,
    SettingsError,
    StorageUnavailable,
    ToolSetupSlow,
)
from workers.persona.mcp_servers import FleetServer, load_mcp_servers
from workers.publisher import CeleryPublisher
from workers.settings import Settings, redact_url

__all__ = [
    "NO_FLEET",
    "CliContext",
    "fleet_environ",
    "lock_mode_conflict",
    "no_fleet_error",
    "persona_dir",
    "recorded_root",
]

NO_FLEET = "no fleet is running: start one with `soulfleet up`, or set REDIS_URL"


def no_fleet_error(environ: Mapping[str, str] | None = None) -> BadInputError:
    """Why there is no fleet to talk to, and what to do (exit 2)."""
    env = os.environ if environ is None else environ
    data = DataDir(default_data_dir(env))
    state = data.running_state()
    if state is not None and not state.embedded_redis:
        # That `up` runs on the user's own Redis; its URL is recorded without the password.
        return BadInputError(
            f"the soulfleet up running on {data.root} (pid {state.pid}) uses its own Redis "
            f"({state.redis_url}): set REDIS_URL to the same URL to reach it"
        )
    return BadInputError(
        f"{NO_FLEET} (no `soulfleet up` runs on {data.root}; for an `up --data DIR`, set "
        "SOULFLEET_DATA=DIR)"
    )


def fleet_environ(
    personas: Path | None, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], UpState | None]:
    """The environment a command's settings are read from, and the `up` it adopted (if any)."""
    env = dict(os.environ if environ is None else environ)
    adopted: UpState | None = None
    if not (env.get("REDIS_URL") or "").strip():
        data = DataDir(default_data_dir(env))
        state = data.running_state()
        # Only an embedded Redis is adopted: a user's own REDIS_URL is recorded redacted.
        if state is not None and state.embedded_redis:
            adopted = state
            # Its password is in redis.url (owner-only); up.json's URL has none.
            env["REDIS_URL"] = data.read_redis_url() or state.redis_url
            for name, value in (
                ("SOULFLEET_KEY_PREFIX", state.key_prefix),
                ("SOULFLEET_QUEUE_PREFIX", state.queue_prefix),
                ("SOULFLEET_PERSONAS", state.personas),
            ):
                if not (env.get(name) or "").strip():
                    env[name] = value
    else:
        state = DataDir(default_data_dir(env)).running_state()
        prefix = (env.get("SOULFLEET_KEY_PREFIX") or "").strip() or Settings().key_prefix
        # An `up` on a Redis of the user's own (recorded without its password) is the fleet
        # this shell reaches when the Redis and prefix are the same: its workers' MCP config
        # and PYTHONPATH are what a persona is checked with, not this shell's.
        if (state is not None and not state.embedded_redis and state.key_prefix == prefix
                and state.redis_url == redact_url(env["REDIS_URL"].strip())):  # fmt: skip
            adopted = state
    if personas is not None:
        env["SOULFLEET_PERSONAS"] = str(personas)
    return env, adopted


def recorded_root(settings: Settings) -> str | None:
    """The personas root the fleet's workers serve, as beat's registry sync recorded it in
    ``settings``' Redis; None when none is recorded or that Redis does not answer (the command
    then says so itself when it needs the fleet)."""
    return _recorded(settings, Keys(settings.key_prefix).registry_root)[0]


def _recorded(settings: Settings, *keys: str) -> list[str | None]:
    """What beat recorded under each of ``keys`` in ``settings``' Redis (one round trip, a
    short wait); None for a key with nothing, or for all when that Redis does not answer."""
    try:
        client = redis.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_connect_timeout=2, socket_timeout=2
        )
        try:
            values = client.mget(keys)
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return [None] * len(keys)
    return [str(value) if value else None for value in values]


def _base_paths() -> list[str]:
    """The import path entries Python has without PYTHONPATH: the standard library and the
    site-packages directories (the virtualenv's, the user's)."""
    paths = [sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    return [path for path in paths if path]


def lock_mode_conflict(settings: Settings, home: Path) -> str | None:
    """Why a write to ``home``'s files from this process could go unexcluded by the fleet's
    own: its beat records another SOULFLEET_LOCK_MODE and ``home`` is under the root its
    workers serve (the two kinds of lock do not see each other). None when no fleet is
    configured or reachable, or nothing conflicts."""
    if not settings.redis_url_explicit:
        return None
    keys = Keys(settings.key_prefix)
    record, root = _recorded(settings, keys.registry_settings, keys.registry_root)
    theirs = fleet_lock_mode(record)
    if theirs is None or theirs == settings.lock_mode or root is None:
        return None
    if not home.resolve().is_relative_to(Path(root).resolve()):
        return None
    return (
        f"SOULFLEET_LOCK_MODE is {settings.lock_mode} here, but the fleet serving {root} "
        f"writes its personas' files with {theirs} locks, which a {settings.lock_mode} lock "
        f"does not exclude: a memory write of this run could overwrite one of the fleet's. "
        f"Run with SOULFLEET_LOCK_MODE={theirs}"
    )


def persona_dir(arg: str, root: Path) -> Path:
    """A persona directory from a name under ``root`` or a path anywhere (``run --local``,
    ``soul``). A bare name prefers the root; a path (or a name the root lacks) is a path."""
    bare = os.sep not in arg and not arg.startswith(".") and valid_persona_name(arg)
    if bare and (root / arg).is_dir():
        return root / arg
    candidate = Path(arg).expanduser()
    if candidate.is_dir():
        return candidate
    if os.sep not in arg and arg not in (".", ".."):
        # A directory under the root whose name the fleet cannot use (zoë, "my persona"):
        # these commands take any persona home (it said "no directory" of one that is there).
        # A terminal may type "zoë" decomposed (e + U+0308): either spelling finds it.
        for name in dict.fromkeys((arg, unicodedata.normalize("NFC", arg),
                                   unicodedata.normalize("NFD", arg))):  # fmt: skip
            if (root / name).is_dir():
                return root / name
    raise UnknownPersona(arg, root, known=_known(PersonaRegistry(root)))


def _known(registry: PersonaRegistry) -> list[str]:
    """The personas under ``registry``'s root, for an unknown name's suggestion ([] when the
    root cannot be listed: the error says what is wrong without one)."""
    try:
        return registry.names()
    except OSError:
        return []


@dataclass
class CliContext:
    """Per-invocation state: the options shared by fleet commands, built lazily."""

    personas: Path | None = None
    environ: Mapping[str, str] | None = None
    _settings: Settings | None = field(default=None, repr=False)
    _fleet: Fleet | None = field(default=None, repr=False)
    _publisher: CeleryPublisher | None = field(default=None, repr=False)
    _stall: StallNotice | None = field(default=None, repr=False)
    adopted: UpState | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            env, self.adopted = fleet_environ(self.personas, self.environ)
            settings = Settings.from_env(env, model_reach=False)
            if settings.redis_url_explicit and not (env.get("SOULFLEET_PERSONAS") or "").strip():
                # No root was given: the fleet's own (what `up` prints REDIS_URL for) rather
                # than ./personas, which hid its personas and refused posts to them.
                served = recorded_root(settings)
                if served is not None:
                    env["SOULFLEET_PERSONAS"] = served
                    settings = Settings.from_env(env, model_reach=False)
            self._settings = settings
        return self._settings

    @property
    def redis_url(self) -> str | None:
        return self._settings.redis_url if self._settings is not None else None

    @property
    def publisher(self) -> CeleryPublisher | None:
        """The publisher of :meth:`fleet` (None before the fleet was reached)."""
        return self._publisher

    @property
    def registry(self) -> PersonaRegistry:
        return PersonaRegistry(self.settings.personas)

    def fleet(self) -> Fleet:
        """The fleet, after a ping: an unreachable Redis fails here with its (redacted) URL.

        Without REDIS_URL and without a running `up` there is no fleet (exit 2).
        """
        if self._fleet is None:
            if not self.settings.redis_url_explicit:
                raise no_fleet_error(self.environ)
            self._publisher = CeleryPublisher(self.settings)
            # A Redis that does not answer (paused, busy, loading) is named after a few
            # seconds instead of leaving the command silent until its socket timeout.
            self._stall = StallNotice(
                redact_url(self.settings.redis_url), lambda line: click.echo(line, err=True)
            )
            client = watched_client(fleet_client(self.settings), self._stall)
            fleet = Fleet(self.settings, client=client, publisher=self._publisher)
            fleet.ping()
            try:
                recorded = fleet.client.get(fleet.keys.registry_settings)
            except redis.RedisError:  # the command meets Redis's error itself, in its words
                recorded = None
            if recorded:
                # Budgets and inbox limits as the fleet's own processes read them (beat records
                # them), not as this shell's environment happens to say.
                adopted = with_fleet_settings(self.settings, str(recorded))
                fleet = Fleet(adopted, client=fleet.client, publisher=self._publisher)
                # and the models status names are the ones its workers call
                fleet.model_defaults = fleet_models(str(recorded)) or fleet.model_defaults
            # Its door checks a persona as its workers would: their MCP servers and PYTHONPATH.
            fleet.mcp_servers = self.fleet_mcp_servers()
            self.import_as_workers()
            self._fleet = fleet
        return self._fleet

    def persona(self, arg: str) -> str:
        """The fleet's name for ``arg`` (a name or a path under the root), checked on disk."""
        registry = self.registry
        try:
            return registry.resolve(arg)
        except UnusablePersonaName:
            raise
        except UnknownPersona as unknown:
            path = Path(arg).expanduser()
            if path.is_dir():
                raise UnknownPersona(arg, registry.root, outside=True) from None
            if not self.settings.redis_url_explicit:
                # No fleet was found to take the personas root from: say that first, since the
                # usual cause is an `up` this command did not find (`up --data DIR`), and the
                # unknown persona follows from it (its root was a guess).
                raise BadInputError(f"{no_fleet_error(self.environ)}; and {unknown}") from None
            self._refuse_if_gone(arg)
            raise UnknownPersona(arg, registry.root, known=_known(registry)) from None

    def _refuse_if_gone(self, name: str) -> None:
        """A persona whose directory was removed while its lane was dead-lettered: say what is
        left of it and how to remove it (status and revive pointed at it under another name)."""
        try:
            gone = self.fleet().orphaned_dead()
        except FleetError:
            return
        lanes = [lane for lane in gone if lane in (name, f"{name}{DREAMER_SUFFIX}")]
        if lanes:
            raise BadInputError(
                f"persona {name!r} has no directory under {self.registry.root}; its "
                f"dead-lettered lane(s) {', '.join(lanes)} cannot run again: restore the "
                "directory and revive, or remove them with the items they kept: `soulfleet "
                "revive --forget-gone`"
            )

    def fleet_root(self) -> Path | None:
        """The personas root the fleet's workers serve, as far as anyone recorded it: beat's
        newest registry sync, else the adopted `up`'s root; None when unknown."""
        served = self.fleet().served_root()
        if served is not None:
            return served
        if self.adopted is not None:
            return Path(self.adopted.personas).expanduser().resolve()
        return None

    def honour_personas(self, command: str) -> None:
        """``--personas`` (or, without it, SOULFLEET_PERSONAS) on a command that sends work:
        honoured only when it IS the fleet's root.

        The CLI reads persona names under ``--personas``, but the workers read theirs under the
        fleet's own SOULFLEET_PERSONAS: a post to a persona the workers cannot see is accepted
        here and dead-letters there (UnknownPersona). So a different or unknown root is
        refused with what to do instead.
        """
        if self.personas is None:
            self._honour_environment(command)
            return
        wanted = self.personas.expanduser().resolve()
        served = self.fleet_root()
        if served == wanted:
            return
        where = (
            f"the fleet's workers read personas from {served}"
            if served is not None
            else "this fleet has not recorded which personas root its workers read (beat has "
            "not synced yet)"
        )
        raise BadInputError(
            f"{command} --personas {self.personas}: {where}, and a turn for a persona they "
            f"cannot see would only fail. Drop --personas to use the fleet's own personas, "
            f"start a fleet on that root (`soulfleet up --personas {self.personas}`), or use "
            "`soulfleet run --local` for a directory anywhere"
        )

    def _honour_environment(self, command: str) -> None:
        """The same guard for the root SOULFLEET_PERSONAS gives this command: a shell whose
        variable points elsewhere than the fleet's workers would queue work that can only be
        dead-lettered (UnknownPersona), and `status` would then misread the failure."""
        try:
            served = self.fleet_root()
        except (CliError, RedisUnavailable, redis.RedisError):
            return  # no fleet reached: the command says so itself, after the persona check
        mine = self.settings.personas.expanduser().resolve()
        if served is None or served == mine:
            return
        raise BadInputError(
            f"{command}: this command reads personas from {mine} (SOULFLEET_PERSONAS), but the "
            f"fleet's workers read them from {served}, and a turn for a persona they cannot "
            f"see would only fail. Set SOULFLEET_PERSONAS={served} (or pass --personas "
            f"{served}), or use `soulfleet run --local` for a directory anywhere"
        )

    def foreign_root_warning(self) -> str | None:
        """Why lane state shown for this command's personas root belongs to other personas:
        the fleet's workers serve another root, and lanes are named by persona, so a
        same-named persona there owns what Redis holds (None when the roots agree or the
        fleet's root is unknown)."""
        served = self.fleet_root()
        mine = self.settings.personas.expanduser().resolve()
        if served is None or served == mine:
            return None
        return (
            f"the fleet's workers serve personas from {served}, not {mine}: the lane state shown "
            f"for a persona here is that of its same-named persona there, if any. Drop "
            "--personas (and SOULFLEET_PERSONAS) to see the fleet's own personas"
        )

    def checked(self, arg: str) -> str:
        """:meth:`persona`, then the persona's check-up: invalid files fail HERE (exit 2, the
        reason named) before anything is queued; warnings (an empty soul) go to stderr."""
        name = self.persona(arg)
        try:
            with self.refusals_explained():
                checkup = check_persona(
                    self.registry.home(name),
                    self.settings.model,
                    turn_max_tokens=self.settings.turn_max_tokens,
                    mcp_servers=self.fleet_mcp_servers(),
                )
        except ToolSetupSlow as exc:
            # Not invalid: the workers' turns retry it until the import finishes (or the lane
            # is dead-lettered), so what is asked for is queued all the same.
            click.echo(
                f"soulfleet: warning: {exc}; accepted all the same: the persona's turns are "
                "retried until it finishes (`soulfleet status` shows the lane's error meanwhile)",
                err=True,
            )
            return name
        for warning in checkup.warnings:
            click.echo(f"soulfleet: warning: {warning}", err=True)
        try:
            storage.check(self.registry.home(name))
        except StorageUnavailable as exc:  # accepted all the same: the lane waits it out
            click.echo(f"soulfleet: warning: {exc}", err=True)
        return name

    def fleet_mcp_servers(self) -> Mapping[str, FleetServer] | None:
        """The MCP servers the fleet's workers know, for checking a persona's ``use``; None
        when that cannot be told (the file the running `up` was given is unreadable now: its
        workers hold what it was)."""
        return self._fleet_mcp()[0]

    def as_workers_see(
        self, home: Path, *, anywhere: bool = False
    ) -> tuple[AbstractContextManager[None], Mapping[str, FleetServer] | None]:
        """How to check persona ``home`` here: a persona of the running `up`'s fleet has its
        tools as that fleet's workers have them (their PYTHONPATH: the context to check it in;
        their MCP servers), as `post` and `tools` check them; one from anywhere else, which no
        worker runs, has this shell's own (its tools are this shell's for `run --local`), unless
        ``anywhere``: `soul` checks a copy staged outside the root as the workers will see it
        once it is moved in (the runbook's way to check an edit before it goes live)."""
        up = self.adopted
        if up is None or not (
            anywhere or home.resolve().is_relative_to(Path(up.personas).expanduser().resolve())
        ):
            return nullcontext(), self.settings.mcp_servers
        servers = self.fleet_mcp_servers()
        # None: the `up`'s config is unreadable now (its workers hold what it was): this
        # shell's is the best guess
        return self.refusals_explained(), self.settings.mcp_servers if servers is None else servers

    @contextmanager
    def refusals_explained(self) -> Iterator[None]:
        """Check a persona as the fleet's workers would, and say so when it is refused: a
        Python tool is imported with the PYTHONPATH the running `up` gave its workers too, and
        a refusal says where the import was tried; a ``use`` its fleet's MCP config lacks
        says, when that config is not this shell's, whose it is and what to do."""
        recorded = self.import_as_workers()
        try:
            yield
        except PersonaConfigError as exc:
            key = str(exc.key or "")
            if key.endswith(".ref") and "cannot import module" in exc.problem:
                if recorded:
                    where = (
                        "it was imported with the PYTHONPATH the running up gave its workers "
                        f"({os.pathsep.join(recorded)}): their turns would fail alike"
                    )
                elif recorded is not None:
                    where = (
                        "the running up gave its workers no PYTHONPATH: unless their own "
                        "environment has it, restart up with a PYTHONPATH that finds it"
                    )
                else:
                    where = (
                        "it was imported in this shell to check the persona: if the workers "
                        "can import it, give this shell their PYTHONPATH"
                    )
                raise PersonaConfigError(exc.path, exc.key, f"{exc.problem} ({where})") from None
            elsewhere = self._fleet_mcp()[1]
            if elsewhere is None or not key.endswith(".use"):
                raise
            raise PersonaConfigError(exc.path, exc.key, f"{exc.problem} ({elsewhere})") from None

    def import_as_workers(self) -> tuple[str, ...] | None:
        """Import path as the running `up` gave its workers: its PYTHONPATH ahead of this
        process's own entries (as PYTHONPATH is), and this shell's PYTHONPATH entries that
        theirs lacks taken out (a tool this shell alone can import passed the check, then
        dead-lettered the lane on the workers), so a persona's Python tools are imported here
        as there; returns the workers' entries (None: no `up` recorded them). Idempotent."""
        state = self.adopted
        if state is None or state.python_path is None:
            return None
        # What would be on the path without PYTHONPATH stays (site-packages, the standard
        # library: a shell naming one in its PYTHONPATH must not lose its own packages), and
        # soulfleet's own directory, whoever's path found it: its lazy imports need it.
        kept = {str(Path(entry).absolute()) for entry in _base_paths()}
        kept.add(str(Path(__file__).resolve().parents[2]))
        only_mine = set(python_path(os.environ)) - set(state.python_path) - kept
        sys.path[:] = [entry for entry in sys.path
                       if not entry or str(Path(entry).absolute()) not in only_mine]  # fmt: skip
        missing = [entry for entry in state.python_path if entry not in sys.path]
        sys.path[1:1] = missing
        return state.python_path

    def _fleet_mcp(self) -> tuple[Mapping[str, FleetServer] | None, str | None]:
        """:meth:`fleet_mcp_servers`, and, when they are not this shell's, why (for the
        error). A running `up` recorded its workers' config; a fleet reached by REDIS_URL (or
        an `up` from before that was recorded) did not, so this shell's SOULFLEET_MCP_CONFIG
        is taken for theirs."""
        settings = self.settings
        state = self.adopted
        mine = str(settings.mcp_config.resolve()) if settings.mcp_config else ""
        if state is None or state.mcp_config is None or state.mcp_config == mine:
            return settings.mcp_servers, None
        started = f"the soulfleet up running on {state.data} (pid {state.pid}) was started"
        if not state.mcp_config:
            return {}, (
                f"{started} without SOULFLEET_MCP_CONFIG, so its workers know no MCP server: "
                f"restart it with SOULFLEET_MCP_CONFIG={mine}"
            )
        why = f"{started} with SOULFLEET_MCP_CONFIG={state.mcp_config}, which its workers read" + (
            f", not this shell's {mine}" if mine else ""
        )
        try:
            return load_mcp_servers(Path(state.mcp_config)), why
        except SettingsError:  # changed since `up` read it: its workers hold what it was
            return None, None

    def warn_if_no_fleet(self, *, turn_queued: bool = True) -> None:
        """Say so on stderr when no beat sweeps under this shell's Redis and key prefix: what
        was just queued waits in an inbox no fleet reads (another REDIS_URL or
        SOULFLEET_KEY_PREFIX than the fleet's, or no fleet started) without a word."""
        settings = self.settings
        try:
            beat = beat_seen(self.fleet(), settings.sweep_interval)
        except RedisUnavailable:
            return
        if beat.state == "sweeping":
            return
        if beat.state == "stopped":
            # A fleet ran here: its workers may well still serve the queue (a queued turn is
            # sent to them); what waits for beat is the rest.
            this = (
                "the turn that takes this item runs if workers still run (`soulfleet status` "
                "says whether any serve its queue), but"
                if turn_queued
                else "this item waits for a turn (a heartbeat, which beat sends, or a post that "
                "wakes the persona), and"
            )
            click.echo(
                f"soulfleet: warning: beat has stopped sweeping under key prefix "
                f"{settings.key_prefix!r} on {redact_url(settings.redis_url)}{beat.last_sweep}: "
                f"{this} "
                "heartbeats, dreams, retries and the repair of lost turns wait until it runs "
                "again; start it (`celery -A workers beat`, or `soulfleet up`)",
                err=True,
            )
            return
        click.echo(
            f"soulfleet: no beat has ever swept under key prefix {settings.key_prefix!r} on "
            f"{redact_url(settings.redis_url)}: what is queued there waits until a fleet using "
            "them runs. If one runs elsewhere, give this shell its REDIS_URL and "
            "SOULFLEET_KEY_PREFIX (`soulfleet up` prints them for other shells); else start one "
            "(`soulfleet up`)",
            err=True,
        )

    def close(self) -> None:
        if self._stall is not None:
            self._stall.close()
        if self._publisher is not None:
            self._publisher.close()
        if self._fleet is not None:
            self._fleet.client.close()
