"""Signalling a job that has just ended must be harmless (the reaper thread may win the race)."""

from __future__ import annotations

import signal
import subprocess
import sys

from helpers.procs import HANG

from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.run.execute import _signal, kill_session


def test_signalling_a_reaped_job_is_harmless() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    _signal(proc, signal.SIGTERM)
    kill_session(proc)
    assert proc.returncode == 0


def test_signal_reaches_a_live_job() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            start_new_session=True)
    _signal(proc, signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_stop_when_ends_the_job_with_its_reason() -> None:
    import os
    import time

    from dtlaunch.run.execute import execute

    calls = []

    def stop_when() -> str | None:
        calls.append(1)
        return "host key check failed for h2: stopping the job" if len(calls) > 3 else None

    started = time.monotonic()
    result = execute([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ),
                     [], stop_when=stop_when, family=OPEN_MPI)
    assert time.monotonic() - started < HANG  # stopped, not waited for
    assert result.exit_code != 0
    assert result.failure is not None
    assert result.failure.reason == "host key check failed for h2: stopping the job"
