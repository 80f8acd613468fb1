"""The job never outlives dtlaunch, however dtlaunch dies; the guard never outlives the job."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.procs import assert_kill_leaves_no_sleeper, gone, pids_where, wait_for

from dtlaunch.agents import lifeline
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.run.execute import execute

ROOT = Path(__file__).resolve().parents[2]

# A job that ignores SIGTERM and has a child that ignores it too: only SIGKILL ends them.
STUBBORN_JOB = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(300)
""")

LAUNCHER = textwrap.dedent("""
    import os, sys
    from dtlaunch.openmpi.family import OPEN_MPI
    from dtlaunch.run.execute import execute
    execute([sys.executable, "-c", sys.argv[1], sys.argv[2]], dict(os.environ), [],
            family=OPEN_MPI)
""")


def guards_of(parent: int) -> list[int]:
    """Running lifeline guards started for the process ``parent``."""
    def guard(line: bytes) -> bool:
        argv = line.split(b"\0")
        return any(a.endswith(b"lifeline.py") for a in argv) and str(parent).encode() in argv

    return pids_where(guard)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGQUIT])
def test_killing_the_launcher_ends_the_whole_job(tmp_path: Path, signum: int) -> None:
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, STUBBORN_JOB, str(pids_file)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(pids_file.exists, "the job to start")
        job = [int(p) for p in pids_file.read_text().split()]
        guards = guards_of(launcher.pid)
        assert guards, "no guard runs beside the job"
        launcher.send_signal(signum)
        launcher.wait(timeout=30)
        left = gone(job + guards)
        assert left == [], f"still running after the launcher died: {left}"
    finally:
        launcher.kill()
        launcher.wait()
        for pid in [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_the_guard_ends_with_the_job() -> None:
    result = execute([sys.executable, "-c", "print('done')"], dict(os.environ), [], family=OPEN_MPI)
    assert result.exit_code == 0
    assert gone(guards_of(os.getpid())) == []


def test_a_missing_launcher_is_one_line_and_exit_127(capsys: pytest.CaptureFixture[str]) -> None:
    result = execute(["/nonexistent/mpirun", "-np", "1"], dict(os.environ), [], family=OPEN_MPI)
    assert result.exit_code == 127
    assert "cannot run /nonexistent/mpirun: No such file or directory" in capsys.readouterr().err
    assert gone(guards_of(os.getpid())) == []


def test_mpirun_starts_after_a_lifeline_that_imports_little() -> None:
    # mpirun starts only once the lifeline has: signal's enums cost it ~9 ms, ctypes is for
    # its prctl alone (imported there), and neither may come back.
    read, write = os.pipe()
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime",
                               lifeline.__file__, str(read), str(os.getpid()), "--", "true"],
                              capture_output=True, text=True, timeout=60, pass_fds=(read,))
    finally:
        os.close(read)
        os.close(write)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert {"_signal", "select"} <= imported  # the measurement sees the lifeline's imports
    assert not imported & {"signal", "enum", "contextlib", "collections", "subprocess", "re"}


def test_session_members_lists_a_session_without_zombies() -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert lifeline.session_members(proc.pid) == [proc.pid]
        lifeline.stop_session(proc.pid, signal_leader=True, grace=5)
        assert lifeline.session_members(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("ignores_term", [False, True], ids=["hung", "hung-ignoring-sigterm"])
def test_killing_doctor_outright_ends_its_local_probe(tmp_path: Path, ignores_term: bool) -> None:
    """SIGKILL leaves dtlaunch no chance to clean up: the launcher's own probe, hung in its
    interpreter, must still end (its tie to dtlaunch is a pipe the kernel closes)."""
    hung = tmp_path / "hung-python"
    hung.write_text("#!/bin/sh\n" + ("trap '' TERM\n" if ignores_term else "") + "exec sleep 3173\n")
    hung.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "dtlaunch", "doctor", "-H", "localhost",
                             "--python", str(hung)], cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert_kill_leaves_no_sleeper(proc, "3173", 60, "the probe never started",
                                  "the local probe outlived a killed dtlaunch")
