"""Run a short local command (`ompi_info`, `ssh -V`, `mpirun --version`) within a time limit,
leaving nothing behind.

The command runs in a session of its own: at the deadline the whole session is killed, not
only the command, so a wrapper script's children (a hung tool under a shell script) neither
outlive dtlaunch nor keep its pipe open. Whatever the command left running in its
group after it exited is ended too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence


def _end_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_bounded(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """(exit status, stdout and stderr together). A command that cannot start raises OSError;
    one still running after `timeout` seconds raises subprocess.TimeoutExpired, ended first."""
    code, out, _ = run_bounded_apart(argv, timeout, stderr=subprocess.STDOUT)
    return code, out.decode(errors="replace")


def run_bounded_apart(argv: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None,
                      cwd: str | None = None, tied: bool = False,
                      stderr: int = subprocess.PIPE) -> tuple[int, bytes, bytes]:
    """run_bounded with stdout and stderr kept apart (a program whose output is data; they are
    joined with `stderr=subprocess.STDOUT`), in `env` (else this process's environment) and
    `cwd` (else this process's folder).
    `tied`: under the lifeline (dtlaunch.agents.lifeline), as a job's launcher is, so that its
    session ends with dtlaunch however dtlaunch ends (SIGKILL too), not only at the deadline:
    for a user's program that may hang (a discovery script)."""
    command, keep = list(argv), -1
    if tied:
        from dtlaunch.agents import guarded_argv, ship

        command, lifeline_read, keep = guarded_argv(ship("lifeline.py").here(), command)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=None if env is None else dict(env), cwd=cwd,
                                pass_fds=(lifeline_read,) if tied else ())
    except BaseException:
        if tied:
            os.close(keep)
        raise
    finally:
        if tied:
            os.close(lifeline_read)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc.pid)
        proc.wait()
        raise
    finally:
        _end_group(proc.pid)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        if tied:
            os.close(keep)  # the lifeline's guard ends whatever is left of its session
    return proc.returncode, out, err or b""
