"""Shared helpers of the shared-mode claim tests: dead holders, live records, records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from workers.persona.owner_records import encode_record
from workers.persona.owners import Owner, host_name, start_token

__all__ = ["die", "live_record", "records_of"]

# Takes the claim (no waiting room), then dies holding it or after releasing it.
_DIER = """
import os, signal, sys
from workers.persona.shared_claims import acquire_claim, release_claim
assert acquire_claim(sys.argv[1], None, may_break=False)
if sys.argv[2] == "after-release":
    release_claim(sys.argv[1])
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def die(claim: Path, how: str) -> int:
    """Run a process that takes ``claim`` and is SIGKILLed (``how``: "holding" it or
    "after-release"); its pid, now dead."""
    done = subprocess.run(
        [sys.executable, "-c", _DIER, str(claim), how], capture_output=True, text=True, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    return int(done.stdout)


def records_of(claim: Path) -> list[Path]:
    """The owner records beside ``claim``, sorted."""
    return sorted(claim.parent.glob(f"{claim.name}.*.owner"))


def live_record(claim: str) -> str:
    """An owner record of another live process of this host (this test's parent, which
    outlives the test), as that process would write it."""
    pid, token = os.getppid(), "ab12" * 4
    record = f"{claim}.{token}.owner"
    owner = Owner(pid, host_name(), start_token(pid))
    Path(record).write_bytes(encode_record(owner, token, locked=False))
    return record
