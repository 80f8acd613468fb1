"""Signalling a job that has just ended must be harmless (the reaper thread may win the race)."""

from __future__ import annotations

import signal
import subprocess
import sys

from dtlaunch.launch import _kill_tree, _signal


def test_signalling_a_reaped_job_is_harmless() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    _signal(proc, signal.SIGTERM)
    _kill_tree(proc)
    assert proc.returncode == 0


def test_signal_reaches_a_live_job() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            start_new_session=True)
    _signal(proc, signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
