"""What `up` tells its terminal, checked on a real `up` as a user runs it.

One persona's files are broken after it was accepted (a host posted through the API, which has
no check-up), so each of its turns fails: the console prints that error ONCE, numbered, and the
status line counts the repeats. Personas added while `up` runs are counted live. The metrics
ports are printed and listen on 127.0.0.1 only. After the fix, `status` says the dead lane is
runnable, and once revived and successful it shows no LAST ERROR.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from functools import partial
from pathlib import Path

import pytest

from tests.cli.test_up_lifetime import _env
from tests.support.cli import copy_demo, reaping, run_soulfleet, soulfleet_argv, subprocess_env
from tests.support.fleet import (
    post_past_the_door,
    read_events,
    revive_past_the_door,
    wait_until,
)
from workers.local.redis_server import free_port
from workers.publisher import connect
from workers.settings import Settings

pytestmark = pytest.mark.integration

DEADLINE = 120.0


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def _failures(data: Path) -> list[dict[str, object]]:
    return [e for e in read_events(data / "logs" / "worker-1.log", "turn.end")
            if e.get("lane") == "milo" and e.get("status") == "error"]  # fmt: skip


def test_up_console_errors_once_live_counts_metrics_and_a_revive(tmp_path: Path) -> None:
    """See the module docstring: one real `up`, every console promise of issue 14 item 7."""
    root = copy_demo(tmp_path / "personas")
    data = tmp_path / "xdg" / "soulfleet"
    output = tmp_path / "up.out"
    base = free_port()
    env = {
        **_env(tmp_path),
        "SOULFLEET_METRICS_PORT": str(base),
        "SOULFLEET_SYNC_INTERVAL": "1",
    }
    with output.open("wb") as sink:
        process = subprocess.Popen(
            soulfleet_argv("up", "--data", str(data), "--personas", str(root)),
            env=subprocess_env(env), stdin=subprocess.DEVNULL, stdout=sink,
            stderr=subprocess.STDOUT, cwd=str(tmp_path),
        )  # fmt: skip

    def text() -> str:
        assert process.poll() is None, output.read_text()
        return output.read_text(encoding="utf-8", errors="replace")

    with reaping(process):
        wait_until(lambda: "ready   worker-1" in text(), timeout=DEADLINE, what="worker ready")
        ports = [int(p) for p in re.findall(r"http://127\.0\.0\.1:(\d+)/metrics", text())]
        assert sorted(ports) == [base, base + 1], text()
        for port in ports:
            wait_until(partial(_listening, port), timeout=DEADLINE, what=f"port {port}")
            assert _listening(port) == {"0100007F"}, (port, _listening(port))

        state = json.loads((data / "up.json").read_text())
        settings = Settings.from_env({
            # up.json holds no password; the owner-only redis.url does (the runbook's way).
            "REDIS_URL": (data / "redis.url").read_text().strip(), "SOULFLEET_PERSONAS": str(root),
            "SOULFLEET_KEY_PREFIX": state["key_prefix"],
            "SOULFLEET_QUEUE_PREFIX": state["queue_prefix"],
        })  # fmt: skip
        fleet = connect(settings)
        # A going session keeps the soul it froze: once milo's first heartbeat had started one
        # (a slow start), its turn never read the broken SOUL.md and ended done. Its next turn
        # composes the soul again, as after a `session reset`.
        fleet.reset_session("milo")
        (root / "milo" / "SOUL.md").unlink()
        (root / "milo" / "SOUL.md").mkdir()  # a directory where a file should be
        post_past_the_door(fleet, "milo", "hello")  # Fleet.post refuses broken files
        wait_until(lambda: fleet.lanes.status("milo")["state"] == "dead", timeout=DEADLINE,
                   what="milo dead-lettered")  # fmt: skip
        status_env = {**_env(tmp_path), "SOULFLEET_PERSONAS": str(root)}
        # `revive` refuses a persona still broken (exit 2, the file's error) ...
        refused = run_soulfleet("revive", "milo", env=status_env)
        assert refused.returncode == 2, refused.stderr
        assert "SOUL.md" in refused.stderr
        # ... so the lane runs again past that check: the same error again (a permanent one
        # dead-letters at once), which the console counts instead of printing twice.
        revive_past_the_door(fleet, "milo")
        wait_until(lambda: fleet.lanes.status("milo")["state"] == "dead"
                   and len(_failures(data)) >= 2, timeout=DEADLINE,
                   what="milo dead-lettered again")  # fmt: skip
        (root / "zed").mkdir()
        (root / "zed" / "SOUL.md").write_text("You are zed.\n")

        def counted() -> bool:
            errors = [line for line in text().splitlines() if "milo: turn error" in line]
            tag = re.search(r"\[(E\d+)\]", errors[0]) if errors else None
            lines = [line for line in text().splitlines() if " status " in line]
            return (
                bool(lines and tag)
                and "personas 4" in lines[-1]
                and (
                    f"{tag.group(1)} x2" in lines[-1]  # type: ignore[union-attr]
                )
            )

        wait_until(counted, timeout=DEADLINE, interval=0.5, what="a status line counting x2")
        errors = [line for line in text().splitlines() if "milo: turn error" in line]
        assert len(errors) == 1, errors
        assert "PersonaFileError" in errors[0]
        dead_lines = [line for line in text().splitlines() if "lane milo dead-lettered" in line]
        assert len(dead_lines) == 1, dead_lines

        (root / "milo" / "SOUL.md").rmdir()
        (root / "milo" / "SOUL.md").write_text("You are milo.\n")

        # "fixed since" once beat's next registry sync (every second here) no longer records
        # milo as invalid: a status run in the same instant as the fix may still see it.
        def fixed() -> bool:
            shown = run_soulfleet("status", env=status_env)
            assert shown.returncode == 0, shown.stderr
            return "fixed since: 1 dead-lettered lane(s)" in shown.stdout

        wait_until(fixed, timeout=DEADLINE, interval=0.5, what="status saying milo is fixed")
        assert run_soulfleet("revive", "milo", env=status_env).returncode == 0

        def revived() -> bool:  # a turn finished after the last failure (not an earlier beat)
            lane = fleet.lanes.status("milo")
            ended, failed = lane["last_end"], lane["last_error_at"]
            return (
                lane["state"] == "idle"
                and lane["last_status"] == "done"
                and isinstance(ended, float)
                and isinstance(failed, float)
                and ended > failed
            )

        wait_until(revived, timeout=DEADLINE, what="milo's revived turn")
        row = next(
            line
            for line in run_soulfleet("status", env=status_env).stdout.splitlines()
            if line.startswith("milo")
        )
        assert "PersonaFileError" not in row, row
        assert row.rstrip().endswith("-"), row
        fleet.client.close()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
