"""Child supervision for `up`: real child processes, stopped stage by stage with deadlines."""

from __future__ import annotations

import json
import signal
import sys
import time
from functools import partial
from pathlib import Path

from tests.support.fleet import wait_until
from workers.local.supervisor import Child, ChildSpec, Supervisor, readable

# A child that says "ready", then on SIGTERM records when and exits (or ignores it).
_CHILD = """
import signal, sys, time
name, record, ignore = sys.argv[1], sys.argv[2], sys.argv[3] == "ignore"
def on_term(signum, frame):
    with open(record, "a") as f:
        f.write(f"{name} {time.time()}\\n")
    if not ignore:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _spec(
    tmp: Path, name: str, stage: int, *, ignore: bool = False, timeout: float = 10.0
) -> ChildSpec:
    return ChildSpec(
        name=name,
        argv=[sys.executable, "-c", _CHILD, name, str(tmp / "record"), "ignore" if ignore else "-"],
        env={"PATH": "/usr/bin:/bin"},
        log_path=tmp / "logs" / f"{name}.log",
        stage=stage,
        stop_timeout=timeout,
    )


def _start_ready(supervisor: Supervisor, *specs: ChildSpec) -> None:
    for spec in specs:
        child = supervisor.start(spec)
        wait_until(partial(_ready, child), timeout=30, what=f"{child.name} ready")


def _ready(child: Child) -> bool:
    return "ready" in child.log_tail()


def test_stop_all_goes_stage_by_stage(tmp_path: Path) -> None:
    """Stage 0 is signalled and gone before stage 1 is signalled; both stages exit cleanly."""
    supervisor = Supervisor()
    _start_ready(supervisor, _spec(tmp_path, "worker", 1), _spec(tmp_path, "beat", 0))
    stopped = supervisor.stop_all()
    assert stopped == [("beat", 0), ("worker", 0)]
    records = dict(line.split() for line in (tmp_path / "record").read_text().splitlines())
    assert float(records["beat"]) <= float(records["worker"])
    assert not any(child.running() for child in supervisor.children)


def test_a_child_past_its_deadline_is_killed(tmp_path: Path) -> None:
    """A child that ignores SIGTERM is SIGKILLed once its stop timeout passes."""
    supervisor = Supervisor()
    _start_ready(supervisor, _spec(tmp_path, "stuck", 0, ignore=True, timeout=0.5))
    began = time.monotonic()
    assert supervisor.stop_all() == [("stuck", -signal.SIGKILL)]
    assert time.monotonic() - began < 10


def test_should_force_kills_without_waiting_for_the_deadline(tmp_path: Path) -> None:
    """A second Ctrl-C (should_force true) kills a stuck stage at once."""
    supervisor = Supervisor()
    _start_ready(supervisor, _spec(tmp_path, "stuck", 0, ignore=True, timeout=600))
    began = time.monotonic()
    assert supervisor.stop_all(should_force=lambda: time.monotonic() - began > 0.3) == [
        ("stuck", -signal.SIGKILL)
    ]
    assert time.monotonic() - began < 30


def test_crashed_reports_a_child_that_exited_on_its_own(tmp_path: Path) -> None:
    """A child that exits unasked is reported with its log; while stopping nothing is."""
    supervisor = Supervisor()
    dying = ChildSpec(
        name="dying",
        argv=[sys.executable, "-c", "print('bye from dying'); raise SystemExit(3)"],
        env={},
        log_path=tmp_path / "dying.log",
    )
    _start_ready(supervisor, _spec(tmp_path, "fine", 0))
    child = supervisor.start(dying)
    crashed = wait_until(supervisor.crashed, timeout=30, what="the crash")
    assert crashed is child
    assert child.popen.returncode == 3
    assert "bye from dying" in child.log_tail()
    supervisor.stop_all()
    assert supervisor.crashed() is None


def test_a_crashed_childs_log_tail_never_shows_an_earlier_run(tmp_path: Path) -> None:
    """The log file is appended across runs of `up`: the crash report shows only what this
    child wrote, not the lines a previous run left at the end of the file."""
    log_path = tmp_path / "dying.log"
    log_path.write_text("old line from yesterday's worker\n" * 20)
    supervisor = Supervisor()
    child = supervisor.start(
        ChildSpec(
            name="dying",
            argv=[sys.executable, "-c", "print('today'); raise SystemExit(3)"],
            env={},
            log_path=log_path,
        )
    )
    wait_until(supervisor.crashed, timeout=30, what="the crash")
    assert child.log_tail() == "today"
    supervisor.stop_all()


def test_a_crash_report_shows_json_log_lines_readably() -> None:
    """`up` prints a dead child's last lines: its JSON log lines come out as
    ``level event key=value`` with long values cut (they were ~20 raw JSON lines); other
    lines (a traceback) unchanged."""
    line = json.dumps({
        "event": "turn.end", "level": "error", "timestamp": "2026-12-01T06:00:00Z",
        "lane": "ava", "error": "x" * 500, "attempts": 3, "extra": None,
    })  # fmt: skip
    shown = readable(line)
    assert shown.startswith("error turn.end lane=ava error=xxx")
    assert "attempts=3" in shown
    assert "timestamp" not in shown
    assert "extra" not in shown
    assert len(shown) < 220
    assert readable("Traceback (most recent call last):") == "Traceback (most recent call last):"
    assert readable("{not json") == "{not json"
