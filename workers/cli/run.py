"""``soulfleet run PERSONA PROMPT``: one turn, answered on the terminal.

Through the fleet by default (:meth:`workers.fleet.Fleet.run`: the prompt is posted as an
interactive item and a worker's turn answers it, exactly as any channel would see it), or
in-process with ``--local`` (:func:`workers.persona.runner.run`: no Redis, no workers; PERSONA may
then be any directory). ``--model`` picks the model for a local run only: a fleet turn uses the
persona's own model, since the worker, not the CLI, makes the model call.

The turn continues the persona's session, so it sees the conversation so far (``--local``
keeps its own session in the persona's directory); ``--new-session`` starts a new one first.

Exit status: 0 when the turn finished (status ``done``), 1 when it ended ``incomplete`` (a
budget limit), ``error`` or ``refused`` (the persona's daily token budget is used up and it
stops every turn), or did not answer within ``--timeout``.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import redis

from workers.cli.beat_health import beat_seen, redis_data_lost
from workers.cli.context import CliContext, lock_mode_conflict, persona_dir
from workers.cli.errors import EXIT_FAILURE, BadInputError, one_line
from workers.cli.group import JSON_FAILURE_SHOWN, cli_context, personas_option
from workers.fleet.errors import LaneDeadLettered, RedisUnavailable
from workers.fleet.outcomes import PostOutcome
from workers.fleet.servertime import ServerClock
from workers.persona.checkup import check_persona
from workers.persona.loop import Budget
from workers.queues import queue_name
from workers.settings import redact_url

__all__ = ["NO_WORKER_HINT_AFTER", "run"]

#: Seconds a `run` waits before checking that some worker consumes the interactive queue.
NO_WORKER_HINT_AFTER = 4.0


@click.command()
@click.argument("persona")
@click.argument("prompt")
@click.option("--local", is_flag=True, help="Run in this process (no Redis, no workers).")
@click.option("--model", "model_spec", metavar="SPEC", help="Model for a --local run.")
@click.option(
    "--new-session",
    is_flag=True,
    help="Start a new session (fresh soul, no history) instead of continuing the current one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print text, status, usage, limit as JSON.")
@click.option(
    "--trusted",
    is_flag=True,
    help="Mark the prompt trusted (an instruction from the operator, not data from outside; "
    "the default, as for `post`, is untrusted).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds to wait for the fleet's answer.",
)
@personas_option
@click.pass_context
def run(
    ctx: click.Context,
    *,
    persona: str,
    prompt: str,
    local: bool,
    model_spec: str | None,
    new_session: bool,
    as_json: bool,
    trusted: bool,
    timeout: float,
    personas: Path | None,
) -> None:
    """Run PERSONA on PROMPT (continuing its session) and print its answer."""
    if not prompt.strip():
        raise BadInputError("PROMPT is empty: give the persona something to answer")
    state = cli_context(ctx, personas)
    if local:
        report = _local(state, persona, prompt, model_spec, _budget(state), new=new_session)
    else:
        if model_spec is not None:
            raise BadInputError(
                "--model only applies with --local: a fleet turn uses the persona's model "
                "(persona.toml `model`, else SOULFLEET_MODEL)"
            )
        report = _fleet_run(ctx, state, persona, prompt, new_session=new_session,
                            as_json=as_json, trusted=trusted, timeout=timeout)  # fmt: skip
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
    elif report["text"] or report["status"] == "done":
        # A failed turn with no text printed an empty line on stdout beside its error.
        click.echo(report["text"])
    if report["status"] != "done":
        why = report.get("limit") or report.get("error") or report.get("reason") or report["status"]
        if not as_json:
            hint = _LIMITS.get(str(report.get("limit") or ""), "")
            click.echo(f"soulfleet: turn ended {report['status']}: {why}{hint}", err=True)
        ctx.exit(EXIT_FAILURE)


def _fleet_run(
    ctx: click.Context,
    state: CliContext,
    persona: str,
    prompt: str,
    *,
    new_session: bool,
    as_json: bool,
    trusted: bool,
    timeout: float,
) -> dict[str, Any]:
    """Post PROMPT to the fleet and wait for the turn that answers it (the report)."""
    state.honour_personas("run")
    name = state.checked(persona)
    state.warn_if_no_fleet()
    posted: list[str] = []
    since = _server_time(state)
    hint = _no_worker_hint(state, name, timeout)
    held = _HeldInterrupt()

    def on_posted(outcome: PostOutcome) -> None:
        posted.append(outcome.lane)
        held.release()

    def on_wait(waited: float) -> None:
        if held.pending:
            raise KeyboardInterrupt
        hint(waited)

    try:
        with held:
            reply = state.fleet().run(
                name,
                prompt,
                new_session=new_session,
                timeout=timeout,
                on_wait=on_wait,
                trusted=trusted,
                on_posted=on_posted,
                on_sending=held.hold,
            )
    except KeyboardInterrupt:
        if not posted and held.pending:
            # A second Ctrl-C while Redis had not answered the post: it may have been kept.
            click.echo(
                f"soulfleet: stopped before Redis answered: the message may or may not be in "
                f"{name}'s inbox; `soulfleet status {name}` shows its inbox (post it again only "
                "if it is not there)",
                err=True,
            )
            ctx.exit(EXIT_FAILURE)
        if not posted:
            raise  # nothing was sent: click says "Aborted!"
        # Ctrl-C stops the waiting, not the turn: say so, or the user posts it again.
        gone = (
            f"stopped waiting: the message is in {name}'s inbox and its turn goes on in the "
            f"fleet; `soulfleet status {name}` shows its reply (last reply) when it is done"
        )
        if as_json:
            click.echo(json.dumps({"persona": name, "status": "interrupted", "error": gone,
                                   "exit": EXIT_FAILURE}))  # fmt: skip
            ctx.meta[JSON_FAILURE_SHOWN] = True
        else:
            click.echo(f"soulfleet: {gone}", err=True)
        ctx.exit(EXIT_FAILURE)
    except TimeoutError as exc:
        lost = _lost_meanwhile(state, since)
        if lost:
            exc = TimeoutError(f"{exc}; {lost}")
        if as_json:  # a script reading stdout gets an answer too (exit 1 either way)
            click.echo(json.dumps({"persona": name, "status": "timeout", "error": str(exc),
                                   "exit": EXIT_FAILURE}))  # fmt: skip
            ctx.meta[JSON_FAILURE_SHOWN] = True
        raise exc from None
    except LaneDeadLettered as exc:
        # Posted before the lane was found dead, or into a dead lane: either way it is kept.
        raise LaneDeadLettered(exc.lane, exc.last_error, kept=bool(posted)) from None
    return {
        "persona": name,
        "text": reply.text,
        "status": reply.status,
        "usage": reply.usage,
        "limit": reply.limit,
        "reason": reply.reason,
        "turn_id": reply.turn_id,
    }


#: What each of a turn's limits is, for the line that says a turn stopped at one: a bare
#: "max_tokens" was read as the session's budget (session.max_tokens) or a model cap.
_LIMITS = {
    "max_tokens": " (the turn's token budget, SOULFLEET_TURN_MAX_TOKENS: counted after each "
    "model call, input included, so a large soul or history uses it up quickly)",
    "max_model_calls": " (the turn's model calls, SOULFLEET_TURN_MAX_MODEL_CALLS)",
    "max_tool_calls": " (the turn's tool calls, SOULFLEET_TURN_MAX_TOOL_CALLS)",
    "max_seconds": " (the turn's wall time, SOULFLEET_TURN_MAX_SECONDS)",
}


class _HeldInterrupt:
    """Holds a first Ctrl-C while the post is on its way, until Redis has answered it.

    Raised between the post script's run and the moment its answer was read, the interrupt
    said "Aborted!" (nothing sent) about a message that was in the inbox, and users posted it
    again. Held, it is raised once the post is known: in the wait that follows (so the turn is
    published first), or not at all when the post failed (its error is said). A second Ctrl-C
    aborts at once (a Redis that does not answer), saying the message may have been kept.
    Before the post's checks at the door have passed and after its answer is read, Ctrl-C
    interrupts as always."""

    def __init__(self) -> None:
        self.pending = False
        self._holding = False
        self._previous: Any = None

    def __enter__(self) -> _HeldInterrupt:
        # Off the main thread no handler can be set; with SIGINT ignored (a job started in the
        # background by a shell), it stays ignored.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):  # fmt: skip
            self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def hold(self) -> None:
        """The post is about to be sent: hold a first Ctrl-C until its answer is read."""
        self._holding = True

    def release(self) -> None:
        """The post is in the inbox: a Ctrl-C from now on interrupts at once."""
        self._holding = False

    def _on_signal(self, _signum: int, _frame: object) -> None:
        if self._holding and not self.pending:
            self.pending = True
            click.echo(
                "soulfleet: waiting for Redis to confirm the message was kept "
                "(Ctrl-C again to abort without knowing)",
                err=True,
            )
            return
        raise KeyboardInterrupt


def _server_time(state: CliContext) -> float:
    """Redis's clock (beat stamps its record of a data loss with it); this host's when Redis
    does not answer (the post that follows says so)."""
    try:
        return ServerClock(state.fleet().client).time()
    except (RedisUnavailable, redis.RedisError):
        return time.time()


def _lost_meanwhile(state: CliContext, since: float) -> str:
    """What a timed-out run adds when beat found Redis had lost its data while it waited:
    the item went with it, and status then showed an idle lane with nothing to say."""
    try:
        lost = redis_data_lost(state.fleet())
        now = ServerClock(state.fleet().client).time()
    except (RedisUnavailable, redis.RedisError):  # TIME refused to an ACL user, say: no hint
        return ""
    at = lost.get("at") if lost else None
    # beat stamps it on Redis's clock, as `since` is taken: a shell's clock running off would
    # hide the loss, or blame one from before the run.
    if not isinstance(at, (int, float)) or at < since:
        return ""
    return (
        f"Redis lost its data {max(0.0, now - at):.0f}s ago, while this waited (beat found its "
        "marker gone): the message was probably lost with it; send it again"
    )


def _no_worker_hint(state: CliContext, name: str, timeout: float) -> Callable[[float], None]:
    """What a waiting `run` says before its timeout: after a few seconds with the turn still
    queued, whether anyone consumes the interactive queue (one remote-control round trip,
    once); and, once, the error of a try that failed meanwhile (the fleet retries it). Waiting
    out the whole timeout in silence is the worst way to learn either."""
    asked = False
    told_error = False
    since = time.time()
    still = f"still waiting up to {timeout:.0f}s (Ctrl-C stops waiting; the item stays queued)"

    def check(waited: float) -> None:
        nonlocal asked, told_error
        # Half a short --timeout: a run that gives up sooner still hears why.
        if waited < min(NO_WORKER_HINT_AFTER, timeout / 2) or (asked and told_error):
            return
        try:
            lane = state.fleet().lanes.status(name)
        except RedisUnavailable:
            return  # a blip: Fleet.run waits it out, and this hook asks again next time
        failed_at = lane.get("last_error_at")
        if not told_error and isinstance(failed_at, float) and failed_at >= since:
            told_error = True
            error = one_line(str(lane.get("last_error") or "?"), 300)
            click.echo(
                f"soulfleet: a try of this turn failed: {error}; the fleet retries it "
                f"(`soulfleet status {name}`); {still}",
                err=True,
            )
        if asked:
            return
        asked = True
        if lane.get("state") != "queued":
            return
        publisher = state.publisher
        if publisher is None or publisher.consumers("interactive"):
            return
        settings = state.settings
        queue = queue_name(settings.queue_prefix, "interactive")
        # The lane may be a running fleet's (same Redis and key prefix, another queue prefix):
        # its message sits in a queue nobody reads, and the persona waited for the reaper's
        # 600 s. Handed to the reaper's next pass, a beat of that fleet sends it to its own
        # workers' queue; with no fleet at all nothing changes.
        turn_id = lane.get("turn_id")
        if isinstance(turn_id, str) and turn_id:
            state.fleet().lanes.unsent([(name, turn_id)], f"no worker consumes {queue}")
        try:
            beat = beat_seen(state.fleet(), settings.sweep_interval)
        except RedisUnavailable:
            beat = None
        if beat is not None and beat.state == "sweeping":
            meanwhile = (
                "the turn is handed to that fleet's reaper meanwhile, which sends it to its own "
                "workers"
            )
        elif beat is not None and beat.state == "stopped":
            meanwhile = (
                f"beat has stopped sweeping under this key prefix{beat.last_sweep}: the turn is "
                "handed to its reaper, which sends it to that fleet's workers once beat runs again"
            )
        else:
            meanwhile = "no beat has ever swept under this key prefix: no fleet runs on it yet"
        click.echo(
            f"soulfleet: no worker is consuming {queue} on {redact_url(settings.redis_url)}: "
            f"start one (`soulfleet up`, or `celery -A workers worker -Q {queue},...`), or, if "
            "a fleet is running, give this shell the same REDIS_URL, SOULFLEET_KEY_PREFIX "
            f"(here {settings.key_prefix!r}) and SOULFLEET_QUEUE_PREFIX (here "
            f"{settings.queue_prefix!r}) as its workers ({meanwhile}); {still}",
            err=True,
        )

    return check


def _budget(state: CliContext) -> Budget:
    settings = state.settings
    return Budget(
        max_model_calls=settings.turn_max_model_calls,
        max_tool_calls=settings.turn_max_tool_calls,
        max_tokens=settings.turn_max_tokens,
        max_seconds=settings.turn_max_seconds,
    )


def _local(
    state: CliContext,
    persona: str,
    prompt: str,
    model_spec: str | None,
    budget: Budget,
    *,
    new: bool,
) -> dict[str, Any]:
    from workers.persona.runner import run as run_persona  # noqa: PLC0415 - only for --local

    settings = state.settings
    home = persona_dir(persona, settings.personas)
    as_workers, mcp_servers = state.as_workers_see(home)
    if (conflict := lock_mode_conflict(settings, home)) is not None:
        raise BadInputError(conflict)
    # The same check-up as a fleet command: an invalid file (a cron that can never fire) exits
    # 2 naming the key, and an empty directory is a warning, not a silent empty soul.
    with as_workers:
        checkup = check_persona(
            home,
            settings.model,
            model=model_spec,
            turn_max_tokens=settings.turn_max_tokens,
            mcp_servers=mcp_servers,
            calls_model=True,
        )
    for warning in checkup.warnings:
        click.echo(f"soulfleet: warning: {warning}", err=True)
    result = run_persona(
        home,
        prompt,
        model_spec,
        budget,
        mcp_servers=mcp_servers,
        session="new" if new else True,
        lock_mode=settings.lock_mode,
        lock_timeout=settings.lock_timeout,
        max_conversations=settings.transcript_max_conversations,
    )
    return {
        "persona": home.resolve().name,
        "text": result.text,
        "status": result.status,
        "usage": result.usage.to_dict(),
        "limit": result.limit,
        "error": result.error,
    }
