"""The fan-out's overall deadline, and an ssh-agent that never answers."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from helpers.procs import HANG

from dtlaunch.probe.prober import fan_out


def test_fan_out_keeps_order_reports_progress_and_turns_crashes_into_fallbacks() -> None:
    seen: list[tuple[int, str]] = []

    def work(item: str) -> str:
        if item == "bad":
            raise RuntimeError("boom")
        time.sleep(0.05 if item == "a" else 0)
        return item.upper()

    results = fan_out(["a", "bad", "c"], work, lambda item, exc: f"{item}:{exc}", 10,
                      on_result=lambda done, item: seen.append((done, item)))
    assert results == ["A", "bad:boom", "C"]
    assert sorted(done for done, _ in seen) == [1, 2, 3]


def test_fan_out_returns_by_its_deadline_whatever_the_work_does() -> None:
    release = threading.Event()

    def work(item: int) -> str:
        if item == 1:
            release.wait(600)  # a host that never answers
        return "ok"

    start = time.monotonic()
    try:
        results = fan_out([0, 1, 2], work, lambda item, exc: "late" if exc is None else "error", 0.5)
    finally:
        release.set()
    assert results == ["ok", "late", "ok"]
    assert time.monotonic() - start < HANG  # it did not wait for the silent host


def test_fan_out_bounds_parallelism() -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def work(item: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return item

    assert fan_out(list(range(12)), work, lambda i, e: -1, 30, max_parallel=3) == list(range(12))
    assert most <= 3


def test_a_stuck_ssh_agent_costs_at_most_the_connect_timeout(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from dtlaunch.reach.ssh_config import load_identities
    from dtlaunch.reach.target import SshTarget

    path = str(tmp_path / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(5)
    held: list[socket.socket] = []
    # Accept and never answer: what a hung agent (or a forwarded one whose link died) does.
    accepter = threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True)
    accepter.start()
    monkeypatch.setenv("SSH_AUTH_SOCK", path)
    target = SshTarget(alias="n", hostname="127.0.0.1", port=22, user="me",
                           identity_files=(os.devnull + "-none",), connect_timeout=0.5)
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(load_identities(target)), daemon=True)
    worker.start()
    worker.join(10)
    try:
        assert found, "load_identities hung on an agent that never answers"
        keys, notes = found[0]  # type: ignore[misc]
        assert keys == [] and any("did not answer" in n for n in notes)
    finally:
        listener.close()
        for sock in held:
            sock.close()
