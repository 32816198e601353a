"""A paid summary is kept per lane, so a retried turn compacting the same history reuses it."""

from __future__ import annotations

import random
from pathlib import Path

import structlog.testing

from tests.persona.test_compaction import make_session
from tests.support.persona import heard_long_ago, make_persona
from tests.support.turns import ReplayModel
from workers.persona.compaction import Compaction, compact
from workers.persona.messages import Completion, Message, Usage
from workers.persona.session import SessionConfig, estimate_tokens
from workers.persona.spend import nothing_new
from workers.persona.summary_cache import SUMMARY_NAME, SummaryFile


def _compact(
    history: list[Message], model: ReplayModel, summaries: SummaryFile | None
) -> Compaction | None:
    total = estimate_tokens(history, "soul")
    config = SessionConfig(max_tokens=total // 2, keep_tail=total // 8)
    return compact(
        history, system="soul", incoming="next", config=config, model=model, dialect="openai",
        summaries=summaries,
    )  # fmt: skip


def _model() -> ReplayModel:
    return ReplayModel(Completion(text="They talked about words.", usage=Usage(900, 40)))


def test_a_second_compaction_of_the_same_history_reuses_the_summary(tmp_path: Path) -> None:
    """The retry of a failed turn compacts the very history its first attempt did: the kept
    summary comes back without a model call, the same history results, and it costs nothing."""
    home = make_persona(tmp_path / "ava")
    history = make_session(random.Random(5), 200)
    first_model, second_model = _model(), _model()
    first = _compact(history, first_model, SummaryFile(home, "ava"))
    second = _compact(history, second_model, SummaryFile(home, "ava"))
    assert first is not None
    assert second is not None
    assert len(first_model.calls) == 1
    assert second_model.calls == []
    assert second.history == first.history
    assert second.reused
    assert not first.reused
    assert second.usage == Usage()


def test_another_history_pays_for_its_own_summary(tmp_path: Path) -> None:
    """A kept summary answers only the history it summarized."""
    home = make_persona(tmp_path / "ava")
    _compact(make_session(random.Random(5), 200), _model(), SummaryFile(home, "ava"))
    model = _model()
    other = _compact(make_session(random.Random(6), 200), model, SummaryFile(home, "ava"))
    assert other is not None
    assert len(model.calls) == 1
    assert not other.reused


def test_a_torn_summary_file_is_a_miss(tmp_path: Path) -> None:
    """A half-written or foreign SUMMARY.json makes the compaction pay, never fail."""
    home = make_persona(tmp_path / "ava")
    history = make_session(random.Random(5), 200)
    _compact(history, _model(), SummaryFile(home, "ava"))
    path = home / "sessions" / "ava" / SUMMARY_NAME
    path.write_bytes(path.read_bytes()[:20])
    model = _model()
    with structlog.testing.capture_logs() as logs:
        again = _compact(history, model, SummaryFile(home, "ava"))
    assert again is not None
    assert len(model.calls) == 1
    assert any(e["event"] == "session.summary_unreadable" for e in logs)


def test_a_summary_that_cannot_be_kept_still_compacts(tmp_path: Path) -> None:
    """sessions/<lane> unwritable (here a file in its place): the turn compacts as before,
    only the saving is lost (a warning)."""
    home = make_persona(tmp_path / "ava")
    (home / "sessions").write_text("not a directory\n")
    model = _model()
    with structlog.testing.capture_logs() as logs:
        done = _compact(make_session(random.Random(5), 200), model, SummaryFile(home, "ava"))
    assert done is not None
    assert len(model.calls) == 1
    assert any(e["event"] == "session.summary_not_kept" for e in logs)


def test_a_kept_summary_is_not_news_for_the_dreamer(tmp_path: Path) -> None:
    """A silent heartbeat that compacted keeps its summary in the lane's directory but commits
    nothing: the dreamer must not take that for a conversation (it would pay for a pass over
    nothing new). Only session states are what a persona heard."""
    home = make_persona(tmp_path / "ava")
    last_pass = heard_long_ago(home, "ava")
    assert nothing_new(home, "ava", last_pass)
    SummaryFile(home, "ava").keep("k" * 40, "They talked about words.")
    assert nothing_new(home, "ava", last_pass)
