"""Ties the job's life to dtlaunch's, even when dtlaunch is killed with SIGKILL.

dtlaunch starts mpirun through this file: ``python -I -S lifeline.py FD PARENT -- mpirun ...``,
in a new session. FD is the read end of a pipe whose only write end dtlaunch holds. This
process forks a guard and then execs mpirun, so mpirun keeps its pid, its exit status and the
signals dtlaunch forwards. The guard blocks on FD: end-of-file means dtlaunch is gone (however
it died, the kernel closes its end), and the guard then stops mpirun (SIGTERM, so it ends its
daemons and ranks in order), waits a grace period, SIGKILLs whatever is left in mpirun's
session, and exits. Remote daemons end when mpirun's ssh links (or srun) end.

While dtlaunch lives, the guard stays in mpirun's process group, so dtlaunch's final kill of
that group ends it too; it also leaves as soon as mpirun is gone. It never outlives the job.

Standard library only, and no dtlaunch imports: it starts with -I -S, once per job, and
imports little (no contextlib, no collections, no signal enums) to start fast: mpirun
starts only when it has.
"""

from __future__ import annotations

import fcntl
import os
import select
import sys
import time

try:  # the C module itself: `signal` adds enums, ~9 ms before mpirun can start
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]

# The words the rest of dtlaunch shares with this agent (through dtlaunch.agents).
__all__ = ["guarded_argv", "moved_clear", "session_members"]

GRACE_SECONDS = 5.0  # mpirun's time to take its ranks down after dtlaunch died
_PR_SET_PDEATHSIG = 1


def session_members(sid: int) -> list[int]:
    """Every process in session ``sid`` (read from /proc), this one excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        # state, ppid, pgrp, session: a zombie is already gone for our purpose.
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
            found.append(int(entry))
    return found


def _kill(pid: int, signum: int) -> None:
    try:  # noqa: SIM105 (contextlib costs this start-up more than it saves)
        os.kill(pid, signum)
    except OSError:  # already gone
        pass


def stop_session(leader: int, signal_leader: bool, grace: float = GRACE_SECONDS) -> None:
    """mpirun (the session's leader) first, gently; then everything left in its session."""
    if signal_leader:
        _kill(leader, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and leader in session_members(leader):
        time.sleep(0.1)
    for _ in range(20):  # a process may fork while we sweep: sweep until nothing is left
        left = session_members(leader)
        if not left:
            return
        for pid in left:
            _kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def guard(fd: int, leader: int, pdeathsig: bool) -> None:
    """Wait for dtlaunch's end (EOF on fd) or mpirun's (this process is re-parented)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):  # never hold mpirun's output pipes open
        os.dup2(devnull, std)
    # Only dtlaunch's end (or mpirun's) ends the guard, never a signal meant for the job.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while os.getppid() == leader:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready and not os.read(fd, 64):
            # dtlaunch is gone. With PR_SET_PDEATHSIG the kernel has already sent mpirun
            # its SIGTERM; a second signal can cut mpirun's orderly shutdown short.
            stop_session(leader, signal_leader=not pdeathsig)
            return


FD_FLOOR = 10  # a descriptor handed to a child by number starts here, clear of those it uses


def moved_clear(fd: int) -> int:
    """`fd` moved to a descriptor >= FD_FLOOR (still close-on-exec); the original is closed.
    os.pipe takes the lowest free numbers, which a child's own redirections may reuse."""
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, FD_FLOOR)
    finally:
        os.close(fd)


def guarded_argv(guard: list[str], argv: list[str]) -> tuple[list[str], int, int]:
    """The command that starts ``argv`` under this guard (``guard``: the argv that runs this
    file, `ship("lifeline.py").here()`), and the pipe's (read, write) ends: pass
    the read end to the child (pass_fds) and close it here; keep the write end open (and
    never inherited: os.pipe's ends are close-on-exec) for as long as the job runs."""
    read_end, write_end = os.pipe()
    # Clear of 0-2: Popen puts the child's standard streams there, over a pipe end that got
    # one of those numbers (dtlaunch started with a standard stream closed).
    read_end = moved_clear(read_end)
    return [*guard, str(read_end), str(os.getpid()), "--", *argv], read_end, write_end


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: lifeline.py FD PARENT_PID -- PROGRAM [ARG...]\n")
        return 2
    fd, parent, command = int(argv[0]), int(argv[1]), list(argv[3:])
    # Linux: SIGTERM to this process (mpirun, after exec) when the thread that started it dies.
    import ctypes  # here, not at the top: dtlaunch imports this file for guarded_argv too

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pdeathsig = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        pdeathsig = False
    if os.getppid() != parent:  # dtlaunch died before the death signal was armed
        return 1
    leader = os.getpid()
    if os.fork() == 0:
        try:
            guard(fd, leader, pdeathsig)
        finally:
            os._exit(0)
    os.close(fd)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; mpirun must not
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"dtlaunch: cannot run {command[0]}: {exc.strerror}\n")
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
