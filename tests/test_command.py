"""command.py: the console script, and a Ctrl-C while it imports the command line."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

_INTERRUPTED_IMPORT = """
import os, signal, sys, time
class Interrupt:  # a real Ctrl-C (SIGINT) arriving while workers.cli is imported
    def find_spec(self, name, path=None, target=None):
        if name == "workers.cli.run":
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            except KeyboardInterrupt as exc:  # as class creation wraps one in __set_name__
                raise RuntimeError("Error calling __set_name__") from exc
        return None
sys.meta_path.insert(0, Interrupt())
from workers.command import main
main()
"""


def test_a_ctrl_c_while_the_command_line_imports_says_aborted_without_a_traceback() -> None:
    """As click does once a command runs: "Aborted!" and exit 1; no Python traceback, also
    when the interrupt would surface as another exception (Python wraps one raised in a
    class's creation), and the command does not run on (here it would print the usage)."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr, done.stdout) == (1, "Aborted!\n", "")


def test_after_the_import_a_ctrl_c_is_clicks_again() -> None:
    """The handler is put back: a Ctrl-C while a command runs is click's "Aborted!" (and a
    KeyboardInterrupt the command can catch), not a flag nobody reads."""
    script = (
        "import signal, workers.cli\n"
        "workers.cli.main = lambda: print(signal.getsignal(signal.SIGINT) is "
        "signal.default_int_handler)\n"
        "from workers.command import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.stdout.strip() == "True", done.stderr


def test_the_console_script_runs_the_command_line() -> None:
    """The entry point pyproject names is this one, and it runs the commands."""
    project = tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text())
    assert project["project"]["scripts"]["soulfleet"] == "workers.command:main"
    done = subprocess.run(
        [sys.executable, "-c", "from workers.command import main; main()", "--version"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("soulfleet, version")


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    """Started with SIGINT ignored (`trap '' INT`, nohup): the import does not take it over,
    so a Ctrl-C then neither aborts the command nor prints anything."""
    script = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + _INTERRUPTED_IMPORT
    done = subprocess.run(
        [sys.executable, "-c", script, "--version"], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("soulfleet, version")
