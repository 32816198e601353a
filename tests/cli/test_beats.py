"""`soulfleet beats [--follow] [--json]`: the surfaced-beats feed on the terminal."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Mapping

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import PASSWORD, commit_turn, lanes_for, soulfleet_argv, subprocess_env
from tests.support.fleet import wait_until


def test_beats_json_lines_oldest_first(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """--json prints one object per committed beat, oldest first, with persona/text/turn id."""
    lanes = lanes_for(env)
    first = commit_turn(lanes, "ava", "Reminder: water")
    second = commit_turn(lanes, "milo", "New paper out")
    result = invoke("beats", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["persona"], r["text"], r["turn_id"]) for r in rows] == [
        ("ava", "Reminder: water", first),
        ("milo", "New paper out", second),
    ]
    assert rows[0]["time"] == 1700000000.5


def test_beats_human_lines_and_count(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """Without --json each beat is 'HH:MM:SS persona: text'; --count limits to the newest."""
    lanes = lanes_for(env)
    commit_turn(lanes, "ava", "one")
    commit_turn(lanes, "ava", "two")
    lines = invoke("beats", "--count", "1").stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(" ava: two")
    # Past Redis's 64-bit COUNT ("Redis refused a command", exit 1): every beat there is.
    huge = invoke("beats", "-n", "100000000000000000000")
    assert huge.exit_code == 0, huge.output
    assert [line.split(": ", 1)[1] for line in huge.stdout.splitlines()] == ["one", "two"]


def test_beats_empty_feed_says_so(invoke: Invoke) -> None:
    """No beats yet: nothing on stdout, a note on stderr, exit 0."""
    result = invoke("beats")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no surfaced beats yet" in result.stderr
    none_asked = invoke("beats", "-n", "0")  # asked for none: no claim that there are none
    assert none_asked.exit_code == 0
    assert none_asked.stdout == none_asked.stderr == ""
    negative = invoke("beats", "-n", "-3")  # clamped to 0, it printed nothing without a word
    assert negative.exit_code == 2
    assert "-3 is negative" in negative.stderr


def _follow(env: Mapping[str, str | None], *, inherit_ignored_sigint: bool = False) -> Follower:
    argv = soulfleet_argv("beats", "--follow", "--json")
    if inherit_ignored_sigint:
        # What a shell does to a background job: SIGINT ignored, and kept ignored across exec.
        argv = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh", *argv]
    process = subprocess.Popen(
        argv, env=subprocess_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return Follower(process)


class Follower:
    """A running ``beats --follow --json`` and the lines it printed so far."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        stdout = process.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(stdout.readline, "")))
        self._reader.start()

    def stop(self, sig: signal.Signals) -> tuple[int, str]:
        """Send ``sig`` and wait for the exit: the exit code and everything on stderr."""
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._reader.join(timeout=10)
        return code, self.process.stderr.read() if self.process.stderr else ""


@pytest.mark.integration
def test_beats_follow_streams_new_beats_until_sigint(env: Mapping[str, str | None]) -> None:
    """--follow prints beats committed after it started; SIGINT ends it with exit 0."""
    follower = _follow(env)
    lines = follower.lines
    try:
        lanes = lanes_for(env)
        turn_id = commit_turn(lanes, "ava", "Reminder: stretch")
        wait_until(lambda: lines, timeout=30, what="a followed beat")
        assert json.loads(lines[0])["turn_id"] == turn_id
        later = commit_turn(lanes, "milo", "second")
        wait_until(lambda: len(lines) >= 2, timeout=30, what="a second followed beat")
        assert json.loads(lines[1])["turn_id"] == later
    finally:
        code, stderr = follower.stop(signal.SIGINT)
    assert code == 0
    assert "Traceback" not in stderr


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_beats_follow_stops_on_signal_even_when_started_with_sigint_ignored(
    env: Mapping[str, str | None], sig: signal.Signals
) -> None:
    """Started as a background job would be (SIGINT ignored, inherited across exec), --follow
    still ends cleanly with exit 0 on SIGINT, and on SIGTERM."""
    follower = _follow(env, inherit_ignored_sigint=True)
    turn_id = commit_turn(lanes_for(env), "ava", "Reminder: stretch")
    try:
        wait_until(lambda: follower.lines, timeout=30, what="a followed beat")
        assert json.loads(follower.lines[0])["turn_id"] == turn_id
    finally:
        code, stderr = follower.stop(sig)
    assert code == 0
    assert "Traceback" not in stderr


def test_beats_redis_unreachable(invoke: Invoke, dead_redis_env: Mapping[str, str | None]) -> None:
    """Redis down: exit 1, URL without password, `soulfleet up` suggested."""
    result = invoke("beats", environ=dead_redis_env)
    assert result.exit_code == 1
    assert PASSWORD not in result.output
    assert "soulfleet up" in result.stderr
