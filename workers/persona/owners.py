"""Who owns a shared-mode claim, and whether that process is gone (from this host's view).

A claim names its owner by host, pid and the process's start token. Only this host's
processes can be checked; a pid alone is not enough, because pids are reused:

* **The host** is the host name plus, inside a pid namespace other than the initial one (a
  container), that namespace's inode: two containers that share a host name do not share
  pids, so a claim from one must never be judged by the other's process table.
* **The start token** is the boot id and the process's start time (``/proc/<pid>/stat``,
  field 22, in clock ticks since boot): a later process that got the same pid (after a crash,
  or a reboot) has another token. Where ``/proc`` is missing it is None and the pid decides.
* **The kernel.** The boot id in the start token names the running kernel, which containers
  share: a claim from another pid namespace of THIS kernel (a container that was restarted
  keeps its host name but gets a new namespace) cannot be judged by pid, but it can by a lock
  the kernel holds for its owner (:mod:`workers.persona.owner_records`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import uuid
from dataclasses import dataclass

__all__ = ["Owner", "host_name", "start_token"]

#: Between a host name and its pid namespace's inode (hex) in :func:`host_name`.
_NAMESPACE_MARK = "?pidns-"
#: The inode Linux reserves for the initial pid namespace.
_INITIAL_PID_NAMESPACE = 0xEFFFFFFC


def host_name() -> str:
    """This host's name as claims record it (with the pid namespace inside a container)."""
    namespace = _INITIAL_PID_NAMESPACE
    with contextlib.suppress(OSError):
        namespace = os.stat("/proc/self/ns/pid").st_ino
    name = socket.gethostname() or "?"
    return name if namespace == _INITIAL_PID_NAMESPACE else f"{name}{_NAMESPACE_MARK}{namespace:x}"


@functools.cache
def boot_id() -> int | None:
    """The running kernel's boot id (shared by every container on it); None where unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return uuid.UUID(boot.read().strip()).int
    except (OSError, ValueError):
        return None


def start_token(pid: int) -> int | None:
    """Boot id and start time of process ``pid`` as one number; None where it cannot be read."""
    boot = boot_id()
    if boot is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return (boot << 64) | int(fields[19])  # field 22 of stat; 3 is the first after ")"
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


@dataclass(frozen=True, slots=True)
class Owner:
    """One process, as a claim records it."""

    pid: int
    host: str
    start: int | None

    @staticmethod
    def current_machine() -> str:
        """This machine's host name, without our pid namespace."""
        return host_name().partition(_NAMESPACE_MARK)[0]

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, host_name(), start_token(pid))

    @property
    def machine(self) -> str:
        """The host name without the pid namespace: which machine (host names must differ
        between the machines sharing a personas filesystem)."""
        return self.host.partition(_NAMESPACE_MARK)[0]

    def before_this_boot(self) -> bool:
        """It ran on another boot than the running one (known from both boot ids)."""
        boot = boot_id()
        return boot is not None and self.start is not None and self.start >> 64 != boot

    def on_this_kernel(self) -> bool:
        """It ran on the kernel running here (this machine, this boot), in any pid namespace."""
        boot = boot_id()
        return boot is not None and self.start is not None and self.start >> 64 == boot

    def gone_here(self) -> bool:
        """It ran on this host and no longer runs: its pid is free, or belongs to a process
        started later. False for another host's process (it cannot be seen from here)."""
        if self.host != host_name():
            return False
        if not _alive(self.pid):
            return True
        now = start_token(self.pid)
        return self.start is not None and now is not None and now != self.start
