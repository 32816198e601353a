"""The persona core used as a library writes no log lines into its caller's output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cli import copy_demo

_RUN = """
import sys
from workers.persona import run
result = run(sys.argv[1], "hi")
print("TEXT:", result.text[:20])
"""

_CONFIGURED = """
import logging, sys, structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
from workers.persona import run
run(sys.argv[1], "hi")
"""


def test_a_library_run_prints_only_what_the_caller_prints(tmp_path: Path) -> None:
    """`run()` from a plain script: stdout holds the script's own line, not the core's
    debug/info events (unconfigured structlog prints every level to stdout)."""
    home = copy_demo(tmp_path / "fleet") / "ava"
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(home)], capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [done.stdout.splitlines()[0]]
    assert done.stdout.startswith("TEXT: ")
    assert "turn.start" not in done.stdout + done.stderr


def test_an_application_that_configured_structlog_keeps_its_configuration(
    tmp_path: Path,
) -> None:
    """The quiet default applies only when nobody configured structlog first."""
    home = copy_demo(tmp_path / "fleet") / "ava"
    done = subprocess.run(
        [sys.executable, "-c", _CONFIGURED, str(home)], capture_output=True, text=True, check=True
    )
    assert "turn.start" in done.stdout
