"""owners.py: telling a claim's dead owner on this host from a live one or another host's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workers.persona.owners import Owner, host_name, start_token


def test_this_process_is_not_gone() -> None:
    """The current process, as it records itself, is alive here; its start token is stable."""
    me = Owner.current()
    assert me.pid == os.getpid()
    assert me.start is not None
    assert start_token(os.getpid()) == me.start
    assert not me.gone_here()


def test_an_exited_process_is_gone() -> None:
    """A process of this host that has exited (and been reaped) is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert start_token(child.pid) is None
    assert Owner(child.pid, host_name(), None).gone_here()


def test_a_reused_pid_is_gone() -> None:
    """A live pid whose start token differs from the recorded one is a later process: the
    recorded owner is gone."""
    me = Owner.current()
    assert me.start is not None
    assert Owner(me.pid, me.host, me.start + 1).gone_here()


def test_a_live_pid_without_a_start_token_is_not_gone() -> None:
    """Without a recorded start token, a live pid is taken as the owner (never break a claim
    that might be live)."""
    assert not Owner(os.getppid(), host_name(), None).gone_here()


def test_another_hosts_process_is_never_gone_from_here() -> None:
    """Another host's process cannot be seen: never judged gone, even with a free pid."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not Owner(child.pid, "otherhost", None).gone_here()


def test_host_name_is_the_hostname_plus_a_container_pid_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host name is socket.gethostname(), marked with the pid namespace outside the
    initial one, so two containers sharing a host name are told apart."""
    monkeypatch.setattr("socket.gethostname", lambda: "box")
    name = host_name()
    namespace = os.stat("/proc/self/ns/pid").st_ino
    if namespace == 0xEFFFFFFC:
        assert name == "box"
    else:
        assert name == f"box?pidns-{namespace:x}"
