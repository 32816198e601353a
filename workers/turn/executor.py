"""One fleet turn, start to commit: the executor the thin Celery task calls.

    start (Lua: reject duplicate/stale, lease + fence, drain inbox into in-flight)
      -> plan the session (continue the lane's session: its frozen soul and history, compacted
         if over budget; or start a new one and compose the soul now)
      -> render the drained items as one message
      -> run the loop (model calls behind the fleet-wide gate; guard before every write)
      -> write the new session state to its own file, ``<session>.f<fence>.json``
      -> finish (Lua, fencing-checked: clear in-flight, publish a surfaced beat, make the
         session state current, queue one follow-up if anything arrived), or fail by kind, or
         defer (an open provider breaker)

Failures by kind (:func:`workers.fleet.errors.classify`, read from the exception's class, never
from its message): a transient one waits out a full-jitter exponential backoff in Redis and is
released by beat (no worker thread sleeps), and dead-letters only after
``SOULFLEET_RETRY_FOR`` of continuous failure; a permanent one dead-letters at once with the
reason; an unclassified one is retried ``SOULFLEET_MAX_ATTEMPTS`` times. A turn refused by an
open provider breaker (or failing transiently while it is open) is deferred: it spends no
attempt and resumes when the breaker closes.

A turn message is claimed on receipt (:meth:`TurnExecutor.receive`, from Celery's
``task_received``) so a worker that dies before start costs seconds, not the broker's
visibility timeout (:mod:`workers.fleet.recovery`).

A worker that loses its lease stops before its next write (:class:`~workers.fleet.errors.LeaseLost`
from the guard) and commits nothing; the lane's new holder re-runs the kept items. Errors in
one persona's files or model end that persona's turn with a recorded error and touch no other
lane.

Why the session write is a file named by the fence plus a pointer moved by ``finish.lua``
(rather than checking the lease and then replacing one session file): a check followed by a
write is a window, and a worker paused in it (GC, a stalled NFS write, SIGSTOP) would
overwrite the session after its lane had moved on. Here no two turns ever write the same file
(each start bumps the fence), and the only step that makes a state current is the same atomic,
fencing-checked script that commits the turn. So a turn that fails, crashes (SIGKILL anywhere,
even between writing its file and finishing) or loses its lease leaves an orphan file that
nothing points to: the session holds only committed turns, and the retry starts from exactly
the state the failed attempt started from. The pointer compares the state the turn started
from too, so a ``reset_session`` during a turn wins over the turn's write. Orphans are removed
after the next commit. The price is rewriting the session state per turn, bounded by
compaction (``max_tokens``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

import structlog

from workers import metrics
from workers.fleet import Fleet
from workers.fleet.errors import ProviderPaused, UnknownPersona
from workers.fleet.gate import Gate, GatedModel
from workers.fleet.lanes import SessionCommit, work_id
from workers.fleet.lease import Renewer
from workers.fleet.outcomes import StartOutcome
from workers.fleet.spend import Refusal, SpendGuard, kind_model
from workers.logs import bind_task, monotonic_wall_time
from workers.persona import storage
from workers.persona.agent import AgentDef, from_dir
from workers.persona.call_log import CallLog
from workers.persona.edits import EDIT_GRACE_SECONDS, while_editing
from workers.persona.errors import StorageUnavailable, TurnAborted
from workers.persona.heartbeat import is_silent
from workers.persona.inbox import render_inbox
from workers.persona.loop import Budget, RunResult, run_loop
from workers.persona.mcp_hub import McpHub
from workers.persona.messages import Message
from workers.persona.models import Model
from workers.persona.models.spec import resolve_model
from workers.persona.session import Pointer
from workers.persona.session_files import SESSIONS_DIR, SessionFiles
from workers.persona.session_plan import SessionPlan, ephemeral_plan, plan_turn
from workers.persona.summary_cache import SummaryFile
from workers.persona.transcripts import TRANSCRIPTS_DIR, FileTranscripts
from workers.persona.turn_time import turn_deadline
from workers.settings import Settings
from workers.turn.baton import Baton
from workers.turn.claims import Claims
from workers.turn.endings import Endings, incomplete_note, input_over_budget
from workers.turn.kit import TurnKit, paused, wrote_log, wrote_memory
from workers.turn.report import TurnReport

__all__ = ["TurnExecutor"]

_log = structlog.get_logger("soulfleet.turn")


class TurnExecutor:
    """Runs turns for one worker process. Thread-safe: one instance serves every pool thread."""

    def __init__(
        self,
        settings: Settings,
        fleet: Fleet,
        renewer: Renewer,
        gate: Gate,
        *,
        worker_id: str,
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.renewer = renewer
        self.gate = gate
        self.worker_id = worker_id
        self.guard = SpendGuard(fleet.ledger, fleet_daily_tokens=settings.daily_tokens)
        self.budget = Budget(
            max_model_calls=settings.turn_max_model_calls,
            max_tool_calls=settings.turn_max_tool_calls,
            max_tokens=settings.turn_max_tokens,
            max_seconds=settings.turn_max_seconds,
            max_reply_bytes=settings.reply_max_bytes,
        )
        self.claims = Claims(
            fleet.lanes, renewer, worker_id=worker_id, ttl=settings.claim_ttl, clock=fleet.clock
        )
        # Off until the worker says its pool is threads (workers.runtime).
        self.baton = Baton(on_waited_out=metrics.BATON_WAITED_OUT.inc)
        self.endings = Endings(
            settings, fleet, renewer, worker_id=worker_id, baton_waited=self.baton.waited
        )
        self.kit = TurnKit(settings, fleet, gate, self.guard)

    @property
    def tool_hub(self) -> McpHub:
        """The process's MCP hub (closed at worker shutdown)."""
        return self.kit.tool_hub

    def receive(self, lane: str, turn_id: str) -> bool:
        """Claim the lane on message receipt (:meth:`Claims.receive`); never raises."""
        return self.claims.receive(lane, turn_id)

    def execute(self, lane: str, turn_id: str, *, task_id: str | None = None) -> TurnReport:
        """Run the turn, holding the process's :class:`Baton` except while it waits."""
        with self.baton.held():
            return self._execute(lane, turn_id, task_id=task_id)

    def _execute(self, lane: str, turn_id: str, *, task_id: str | None) -> TurnReport:
        bind_task(task_id=task_id, lane=lane, turn_id=turn_id)
        started = self.claims.start(lane, turn_id)
        if started.status != "started":
            _log.info("turn.dropped", reason=started.status)
            if started.status == "dead":
                _log.warning("turn.dead_lettered", attempts=started.attempt)
            return TurnReport(lane, turn_id, started.status)
        bind_task(task_id=task_id, lane=lane, turn_id=turn_id, fence=started.fence)
        handle = self.renewer.register_lease(lane, started.fence)
        self.endings.hold(handle)
        began = time.monotonic()
        try:
            return self._run(lane, turn_id, started, handle.check, began)
        except TurnAborted as exc:
            metrics.LEASE_LOSSES.inc()
            _log.warning("turn.lease_lost", fence=started.fence, error=str(exc))
            self.endings.end(lane, turn_id, started, "lease_lost", began, error=str(exc))
            return TurnReport(lane, turn_id, "lease_lost")
        finally:
            self.endings.hold(None)
            self.renewer.unregister(handle)

    def _run(
        self,
        lane: str,
        turn_id: str,
        started: StartOutcome,
        guard: Callable[[], None],
        began: float,
    ) -> TurnReport:
        name, role = self.fleet.registry.parse_lane(lane)
        kind = "dream" if role == "dreamer" else started.kind
        prepared = self._prepare(lane, turn_id, started, began, name=name, kind=kind)
        if isinstance(prepared, TurnReport):
            return prepared
        persona, resolved = prepared
        spec = resolved.spec
        try:
            agent = self.kit.agent(persona, role, spec)
            declared, budget = self.kit.declared(agent, role, self.budget)
            # One id for every attempt at this turn's work: a retry repeating a memory write is
            # answered as before instead of applying it twice, and a model call its failed
            # attempt already bought is answered from the call log instead of paid again.
            work = work_id(lane, started.commits, started.born_ms)
            tools = agent.toolset(
                lock_mode=self.settings.lock_mode,
                lock_timeout=self.settings.lock_timeout,
                declared=declared,
                write_scope=work,
            )
            model = self.kit.model(resolved, kind, f"{lane}:{turn_id}:{started.fence}", persona,
                                   calls=CallLog(agent.home, lane, work), lane=lane)  # fmt: skip
        except TurnAborted:
            raise
        except Exception as exc:  # a persona that cannot be composed fails only its own turn
            failed = self._edit_grace(exc, persona.home, started)
            return self.endings.fail(lane, turn_id, started, _named(failed), began, cause=failed,
                                     model=spec)  # fmt: skip

        refused = self._refuse_early(lane, turn_id, started, began, agent=agent, model=model)
        if refused is not None:
            return refused

        prompt = render_inbox(
            started.items,
            started.ticks,
            persona=name,
            tick_channel="dream" if role == "dreamer" else "heartbeat",
        )
        try:
            # The turn's max_seconds counts from its start (self.budget's: `budget` already
            # had its MCP servers' start taken off). A compaction's model call may take half
            # of what is left: one cut there leaves the turn time to answer with the whole
            # history, where a cut at the limit left every later, longer summary cut too.
            with turn_deadline(_seconds_left(self.budget, began) / 2):
                plan = self._plan(lane, started, agent, role, prompt=prompt, model=model)
            # Scoped to the turn's lane and synced once, before the turn ends: a killed worker
            # loses none of it (written at once), a machine crash at most the lines of a turn
            # that had not committed, whose items then run again.
            writer = FileTranscripts(
                agent.home,
                lanes=[lane],
                max_conversations=self.settings.transcript_max_conversations,
            ).open(lane, plan.session_id, sync_each=False)
        except TurnAborted:
            raise
        except Exception as exc:  # an unreadable session, or a transcripts/ leading out of
            # the home, fails this turn with its reason instead of escaping as a "lost worker"
            error = (
                storage.failure_message(
                    agent.home, exc, "opening the turn's session and transcript"
                )
                or f"{type(exc).__name__}: {exc}"
            )
            return self.endings.fail(
                lane, turn_id, started, error, began, cause=exc, provider=model.provider, model=spec
            )

        def record(message: Message) -> None:
            guard()
            writer.append(message)

        failure: tuple[str, BaseException | None] | None = None
        try:
            result = run_loop(
                system=plan.soul,
                prompt=prompt,
                tools=tools,
                model=model,
                # A compaction already spent some of it, and preparing the turn its time.
                budget=replace(
                    plan.left_of(budget), max_seconds=max(0.0, _seconds_left(self.budget, began))
                ),
                on_message=record,
                guard=guard,
                persona=agent.name,
                history=plan.history,
            )
            writer.sync()
            result = plan.charge(result)
            if result.status == "error":
                failure = (result.error or "model error", result.cause)
        except TurnAborted:
            raise
        except Exception as exc:
            stored = storage.failure_message(agent.home, exc, "writing the turn's transcript")
            failure = (stored or f"{type(exc).__name__}: {exc}", exc)
        finally:
            writer.close()
        if failure is not None:
            error, cause = failure
            return self.endings.fail(
                lane,
                turn_id,
                started,
                error,
                began,
                cause=cause,
                provider=model.provider,
                model=spec,
            )
        return self._commit(
            lane,
            turn_id,
            started,
            result,
            agent=agent,
            role=role,
            guard=guard,
            began=began,
            plan=plan,
        )

    def _refuse_early(
        self,
        lane: str,
        turn_id: str,
        started: StartOutcome,
        began: float,
        *,
        agent: AgentDef,
        model: GatedModel,
    ) -> TurnReport | None:
        """End the turn before its model call when it cannot go well: its provider's breaker is
        open (deferred: spends no attempt) or the persona's filesystem cannot take its files
        (a transient failure). None: go on."""
        if paused(model):
            # Known before the first write: park the turn without opening a transcript.
            why = str(ProviderPaused(model.provider))
            return self.endings.defer(
                lane, turn_id, started, began, provider=model.provider, why=why
            )
        try:
            # One statvfs (and after a storage failure, a test write): a turn that could not
            # be saved is refused before its model call is paid for.
            storage.check(
                agent.home,
                probe=started.error.startswith(storage.STORAGE_MARK),
                within=(f"{SESSIONS_DIR}/{lane}", f"{TRANSCRIPTS_DIR}/{lane}"),
            )
        except StorageUnavailable as exc:
            return self.endings.fail(lane, turn_id, started, str(exc), began, cause=exc,
                                     model=model.spec)  # fmt: skip
        return None

    def _plan(
        self,
        lane: str,
        started: StartOutcome,
        agent: AgentDef,
        role: str,
        *,
        prompt: str,
        model: GatedModel,
    ) -> SessionPlan:
        now = self.fleet.clock.time()
        if role == "dreamer":
            # Every dream pass is a session of its own: fresh soul, no history, never stored.
            return ephemeral_plan(lane, agent.soul, now=now)
        # As the turn's start found it: a reset after that wins at commit (finish.lua compares).
        pointer = Pointer(started.session, started.session_epoch)
        files = SessionFiles(agent.home, lane)
        return plan_turn(
            lane=lane,
            pointer=pointer,
            base=files.read(pointer.state),
            # Written well before the lane's state was created: a file of an earlier one. The
            # margin: `born` is stamped by the clock of the worker that first started a turn
            # of it, the file's time by the persona filesystem's (another host, an NFS server).
            pointer_lost=pointer.state is None
            and files.has_fleet_states(before=started.born_ms / 1000 - 60.0),
            compose=agent.soul,
            config=agent.session,
            now=now,
            incoming=prompt,
            model=model,
            turn_tokens=self.budget.max_tokens,
            # A summary this turn pays for is kept: its retry, if it fails, reuses it.
            summaries=SummaryFile(agent.home, lane),
        )

    def _prepare(
        self, lane: str, turn_id: str, started: StartOutcome, began: float, *, name: str, kind: str
    ) -> tuple[AgentDef, Model] | TurnReport:
        """The persona and the model this turn pays for; or how the turn ended without
        a model call (a persona that cannot be read fails; one over budget, or a dream with
        nothing new, is refused by the spend guard)."""
        try:
            persona = from_dir(self.fleet.registry.home(name))
            # Resolved here so the logs name the model really called ("inherit" names none).
            resolved = resolve_model(
                kind_model(persona, kind, self.settings), self.settings.model, base_dir=persona.home
            )
        except Exception as exc:  # a persona that cannot be composed fails only its own turn
            self.endings.started(started, kind, None)
            failed = self._while_editing(exc, name, started)
            return self.endings.fail(lane, turn_id, started, _named(failed), began, cause=failed)
        spec = resolved.spec
        self.endings.started(started, kind, spec)
        last_pass = None if started.last_pass_ms is None else started.last_pass_ms / 1000
        began_pass = (
            None if started.last_pass_began_ms is None else started.last_pass_began_ms / 1000
        )
        refusal = self.guard.check(persona, kind, last_pass=last_pass, last_pass_began=began_pass)
        if refusal is None and kind != "dream" and not started.items and not started.ticks:
            # A revive with nothing kept or posted (`--drop-kept` of the only item): asking the
            # model about an empty inbox was paid for, and saved into the conversation.
            refusal = Refusal(
                "nothing_to_answer",
                "skipped",
                "the turn found no item and no tick to answer (a revive that kept nothing, say)",
            )
        if refusal is not None:
            return self.endings.refuse(
                lane, turn_id, started, refusal, began, kind=kind, model=spec
            )
        return persona, resolved

    def _while_editing(self, exc: BaseException, name: str, started: StartOutcome) -> BaseException:
        """``exc``, made transient when the persona's files were changed a moment ago
        (:mod:`workers.persona.edits`)."""
        try:
            home = self.fleet.registry.home(name)
        except UnknownPersona:  # no directory: moved aside a moment ago (a swap), or removed
            return self._edit_grace(exc, self.fleet.registry.root / name, started, gone=True)
        except Exception:  # no directory to look at: the failure stands as it is
            return exc
        return self._edit_grace(exc, home, started)

    def _edit_grace(
        self,
        exc: BaseException,
        home: str | os.PathLike[str],
        started: StartOutcome,
        *,
        gone: bool = False,
    ) -> BaseException:
        """:func:`~workers.persona.edits.while_editing` for this turn: a directory found gone
        gets the grace only while the lane has been failing for less than EDIT_GRACE_SECONDS
        (a busy personas root, changing all the time, must not keep a removed persona's lane
        retrying; one retry alone, a backoff's jittered second or two later, found many a
        move still under way)."""
        since = started.failing_since_ms
        now_ms = self.fleet.clock.time() * 1000
        moved_grace = since is None or now_ms - since < EDIT_GRACE_SECONDS * 1000
        return while_editing(exc, home, gone=gone, moved_grace=moved_grace)

    def _commit(
        self,
        lane: str,
        turn_id: str,
        started: StartOutcome,
        result: RunResult,
        *,
        agent: AgentDef,
        role: str,
        guard: Callable[[], None],
        began: float,
        plan: SessionPlan,
    ) -> TurnReport:
        # Only a heartbeat alone can be silent: a post that joined it made it a conversation,
        # whose answer surfaces even when it quotes the sentinel (or appends it, as the
        # heartbeat prompt tells a model to).
        silent = is_silent(result.text) and not started.items
        beat: dict[str, str] | None = None
        if role == "persona" and started.ticks > 0:
            metrics.BEATS.labels(outcome="silent" if silent else "surfaced").inc()
            if not silent and result.text.strip():
                beat = {"persona": agent.name, "text": result.text}
        files = SessionFiles(agent.home, lane)
        session: SessionCommit | None = None
        try:
            if role == "dreamer" and not silent and not wrote_log(result):
                # The dream prompt asks the model to log its pass; if it did not, the runtime
                # keeps the promise that what a dream did lands in memory/log.md. A pass that
                # did nothing and said nothing (input over budget: no call) is not logged.
                text = result.text.strip()
                if text or wrote_memory(result):
                    guard()
                    self.kit.log_dream(agent, turn_id, text or "(changed memory, no summary)")
            silent_beat = started.ticks > 0 and silent
            state = plan.conclude(result.messages, silent_beat=silent_beat)
            if state is not None:
                guard()
                # Named by the fence: no other turn ever writes this file (module doc).
                session = SessionCommit(plan.pointer, files.write(state, f"f{started.fence}"))
        except TurnAborted:
            raise
        except Exception as exc:  # the persona's home refused the turn's own files (a
            # read-only sessions/ directory, a full disk): this turn fails with the reason,
            # recorded and counted, instead of escaping the task as a "lost worker"
            failed = self._edit_grace(exc, agent.home, started)  # a directory swapped mid-turn
            error = (
                storage.failure_message(
                    agent.home, exc, "saving the turn (its model calls were made and counted)"
                )
                or f"could not save the turn: {type(exc).__name__}: {exc}"
            )
            if failed is not exc:
                error = f"could not save the turn: {failed}"
            return self.endings.fail(lane, turn_id, started, error, began, cause=failed,
                                     model=agent.model)  # fmt: skip
        guard()
        # Taken before the commit: once finish returns, a follow-up may already be running on
        # another worker, and "this turn ended before the next began" must hold in the logs.
        ended_at = monotonic_wall_time()
        self.endings.release_lease()
        # Its model calls are paid for: a Redis restart here is waited out, not thrown away.
        finished = self.endings.ending(
            lambda: self.fleet.lanes.finish(
                lane,
                started.fence,
                status=result.status,
                text=result.text,
                beat=beat,
                reply_ids=[item.id for item in started.items if item.reply],
                reply_extra={"usage": result.usage.to_dict(), "limit": result.limit},
                session=session,
                publisher=self.worker_id,
                claim_ttl=self.settings.claim_ttl,
                note=incomplete_note(
                    result,
                    self.fleet.registry.parse_lane(lane)[0],
                    dreamer=role == "dreamer",
                ),
            ),
        )
        if input_over_budget(result):  # every turn of the persona ends so: an alert's worth
            metrics.TURNS_NO_CALL.labels(kind=started.kind).inc()
        if role == "dreamer" and result.model_calls:
            # The plan was made before the pass read anything. A pass that made no model call
            # (its input over the token budget) read nothing: what came before it is still new
            # to the next pass (the mark moved, and every pass after was skipped "nothing new").
            self.guard.passed(lane, self.fleet.clock.time(), plan.started_at)
        if finished.follow_up_turn_id and finished.follow_up_kind:
            self.endings.follow_up(lane, finished.follow_up_turn_id, finished.follow_up_kind)
        if session is not None:
            self._collect(files, session, finished.session, plan.pointer)
        metrics.CACHED_INPUT_TOKENS.inc(result.usage.cached_input_tokens)
        metrics.CACHE_WRITE_INPUT_TOKENS.inc(result.usage.cache_write_input_tokens)
        self.endings.end(
            lane,
            turn_id,
            started,
            result.status,
            began,
            ended_at=ended_at,
            limit=result.limit,
            silent=silent,
            tokens=result.usage.total_tokens,
            **result.usage.to_dict(),
            model_calls=result.model_calls,
            session=plan.session_id,
            session_reason=plan.reason,
            session_write=finished.session,
            compacted=plan.compacted or None,
            model=agent.model,
            follow_up=finished.follow_up_turn_id,
        )
        return TurnReport(lane, turn_id, result.status, result.text, finished.follow_up_turn_id)

    def _collect(
        self, files: SessionFiles, session: SessionCommit, outcome: str, base: Pointer
    ) -> None:
        try:
            if outcome == "committed":
                files.retire(session.state, base.state)
            else:
                _log.warning("session.reset_during_turn", state=session.state)
                files.discard(session.state)
        except OSError as exc:  # housekeeping only: the commit already happened
            _log.warning("session.collect_failed", error=str(exc))


def _named(exc: BaseException) -> str:
    """``exc`` as a lane's error shows it: its class, then its message."""
    return f"{type(exc).__name__}: {exc}"


def _seconds_left(budget: Budget, began: float) -> float:
    """What is left of the turn's ``max_seconds`` (it began at ``began``, monotonic)."""
    return budget.max_seconds - (time.monotonic() - began)
