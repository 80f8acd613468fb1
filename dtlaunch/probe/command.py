"""The probe: one POSIX shell script per host that reports everything doctor checks.

Its files live in dtlaunch/agents (linted and type-checked like the rest) and travel as text:
`sh -c "$(probe.sh)"` with the Python halves as arguments.

It runs in ONE exec per host, through the login shell that sshd starts for a non-interactive
command, so it sees the PATH that mpirun's own ssh login will see. Every user-supplied value
travels as a positional parameter, quoted with `shlex.quote`, never spliced into the script.

Cost: `import torch` takes about a second of CPU, so versions come from the names of the
installed *.dist-info folders, and the facts that need a real import (does torch import,
Horovod's controllers and tensor operations) are computed once per host and installation, and
cached there (agents/remote_probe.py).

`nvidia-smi` (NVIDIA GPUs) starts beside the rest of the probe and is given up on after
`gpu_timeout` seconds; where it is not installed nothing runs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass

from dtlaunch.agents import LOCAL_SHELL, ship
from dtlaunch.check.facts import HostFacts, parse_probe_output
from dtlaunch.core.errors import DtlaunchError
from dtlaunch.core.tracker import Tracker

END_MARK = b"\n@@end\n"  # the probe's last line (probe.sh)


@dataclass(frozen=True)
class ProbeArgs:
    python: str
    script: str | None = None  # absolute path
    module: str | None = None
    cwd: str = ""
    peers: tuple[str, ...] = ()
    peer_ssh_args: tuple[str, ...] = ()
    imports: bool = True
    gpu_timeout: float = 10.0  # seconds nvidia-smi may take before the host's GPUs count as hung
    # This machine's mpirun (absolute path): Open MPI starts the daemons from the same
    # prefix on every host, so that path is checked there, not the login PATH's mpirun.
    mpi_launcher: str = ""
    # The PATH the job exports to its ranks: a bare interpreter name (`python`) is looked up
    # there, as the ranks will, not on the login shell's PATH. "": the login shell's.
    path: str = ""
    program: str = ""  # the command's executable, when it is not the interpreter ("": none)


def build_probe_argv(args: ProbeArgs, shell: str = "sh") -> tuple[str, ...]:
    """probe.sh with its positional parameters, in its order."""
    return (*ship("probe.sh").shell(shell, "dtlaunch-probe"), args.python, args.script or "",
            args.module or "", args.cwd, ship("remote_probe.py").text, " ".join(args.peers),
            " ".join(args.peer_ssh_args), "1" if args.imports else "0",
            ship("import_probe.py").text, str(max(1, round(args.gpu_timeout * 1000))),
            args.mpi_launcher, args.path, args.program)


def build_tied_probe_argv(args: ProbeArgs, shell: str = "sh") -> tuple[str, ...]:
    """The probe tied to its standard input (tied.sh): when that closes, it ends."""
    return (*ship("tied.sh").shell(shell, "dtlaunch-tied"), *build_probe_argv(args, shell))


def build_remote_command(args: ProbeArgs) -> str:
    """One command string for sshd's login shell, every piece quoted. The probe is tied to
    the command's input: when the channel closes (Ctrl-C, a timeout), it ends."""
    return " ".join(shlex.quote(p) for p in build_tied_probe_argv(args))


class _Session:
    """A process started in a session of its own, ended with everything it started."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def probe_local(args: ProbeArgs, timeout: float = 180.0,
                tracker: Tracker | None = None) -> HostFacts:
    """The same probe on this machine, in dtlaunch's own environment (what mpirun inherits).

    It runs in a session of its own, so a timeout, Ctrl-C or the `tracker` closing ends
    everything it started (a hung `ip` or interpreter included), and no pipe stays open. It is
    also tied (tied.sh) to a pipe only dtlaunch holds open: if dtlaunch is killed outright
    (SIGKILL), the pipe closes and the probe ends as a remote one does when its channel goes."""
    tracker = Tracker() if tracker is None else tracker
    read_end, tie = os.pipe()  # neither end is inherited by anything else dtlaunch starts
    try:
        with tracker.opening():
            proc = subprocess.Popen(list(build_tied_probe_argv(args, LOCAL_SHELL)),
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    stdin=read_end, env=dict(os.environ),
                                    start_new_session=True)
            session = _Session(proc)
            tracker.add(session)
    except BaseException:
        os.close(tie)
        raise
    finally:
        os.close(read_end)
    try:
        out = _read_until_done(proc, timeout)
    finally:
        session.close()
        os.close(tie)
        tracker.discard(session)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # not read to its end: a daemon may hold it open for ever
    return parse_probe_output(out.decode(errors="replace"))


def _read_until_done(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The probe's output, once the shell has exited and printed its last section (a process
    it started that left its session may keep the pipe open: its end is not waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            out, _ = proc.communicate(timeout=max(0.0, min(left, 1.0)))
            return out
        except subprocess.TimeoutExpired as exc:
            partial = exc.output or b""
            if proc.poll() is not None and END_MARK in partial:
                return partial
            if left <= 0:
                raise DtlaunchError(f"the local probe did not finish in {timeout:g} s") from None
