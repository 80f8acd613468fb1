"""Run mpirun as a child: stream tagged output live, forward signals, enforce --timeout.

The only module that starts the job. mpirun gets its own session so that a terminal's Ctrl-C
reaches dtlaunch alone, which forwards it once and escalates if mpirun does not finish. mpirun
starts under a guard (dtlaunch.agents.lifeline) that ends the job if dtlaunch itself is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import IO, TYPE_CHECKING

from dtlaunch.core.errors import EXIT_TIMEOUT, DtlaunchError, exit_for_signal
from dtlaunch.core.failure import Failure
from dtlaunch.core.private_files import NotPrivate, write_private_program
from dtlaunch.mpi import MpiFamily, OutputDemux
from dtlaunch.run.events import RANKS_RUNNING, Progress
from dtlaunch.run.failure_report import JobRanks, first_in_time
from dtlaunch.run.job_output import JobOutput
from dtlaunch.run.spool import Spool

if TYPE_CHECKING:
    from pathlib import Path

# After forwarding a signal, how long mpirun gets to take its ranks down before we kill it.
GRACE_SECONDS = 6.0


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int
    failure: Failure | None
    interrupted_by: int | None = None  # signal number dtlaunch received
    timed_out: bool = False
    ranks: JobRanks = field(default_factory=JobRanks)  # what the ranks' records told

    @property
    def stopped(self) -> bool:
        """Ended by dtlaunch's signal or --timeout: not the job's own failure."""
        return self.interrupted_by is not None or self.timed_out


def spawn(argv: Sequence[str], env: Mapping[str, str], stdin_pipe: bool = False,
          ) -> tuple[subprocess.Popen[bytes], tuple[Spool, Spool], int]:
    """Start the launcher under the lifeline, its output to spool files, in a session of its
    own: (process, (stdout spool, stderr spool), the lifeline's write end, to keep open for as
    long as the job runs)."""
    from dtlaunch.agents import guarded_argv, ship

    spools = (Spool(), Spool())
    command, lifeline_read, lifeline_write = guarded_argv(ship("lifeline.py").here(), list(argv))
    try:
        proc = subprocess.Popen(
            command,
            env=dict(env),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=spools[0].fd,
            stderr=spools[1].fd,
            start_new_session=True,
            pass_fds=(lifeline_read,),
        )
    except BaseException:
        os.close(lifeline_write)
        for spool in spools:
            spool.close()
        raise
    finally:
        os.close(lifeline_read)
    return proc, spools, lifeline_write


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher's whole session (local ranks included); remote daemons lose their
    lifeline when the launcher's ssh links close and take their ranks down. Not just its
    process group: Open MPI's plm slurm puts its srun in a group of its own, and after a lost
    node that srun would wait for the node (minutes) after everything else is gone."""
    from dtlaunch.agents import session_members

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _signal(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Signal mpirun unless it is already gone; Popen skips a child it has reaped, so a
    recycled pid is never hit."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signum)


def _feed(proc: subprocess.Popen[bytes], data: bytes | Callable[[IO[bytes]], None]) -> None:
    """Write the launcher's input and close it (in a thread: a pipe holds 64 KiB); or let
    `data` write it for as long as the job needs (an elastic job's later hosts)."""
    assert proc.stdin is not None
    if callable(data):
        data(proc.stdin)
        return
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.write(data)
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()


def execute(argv: Sequence[str], env: Mapping[str, str], rank_hosts: Sequence[str],
            timeout: float | None = None, timeout_total: float | None = None,
            output_dir: Path | None = None, log_label: str | None = None,
            announce: Callable[[str], None] = lambda msg: None,
            stop_when: Callable[[], str | None] | None = None,
            new_demux: Callable[[str], OutputDemux] | None = None,
            prefix_timestamp: bool = False, *, family: MpiFamily,
            support_files: Sequence[tuple[str, str]] = (), shown_ranks: frozenset[int] | None = None,
            ranks_to_stderr: bool = False, on_progress: Callable[[Progress], None] | None = None,
            stdin_data: bytes | Callable[[IO[bytes]], None] | None = None,
            on_lost_host: Callable[[str], None] | None = None) -> LaunchResult:
    """Run mpirun to the end. ``stop_when`` is polled while it runs: a returned reason stops
    the job (used by the pre-flight's host-key check that runs alongside the start).
    ``new_demux(stream)`` reads the launcher's output (default: the family's).
    ``family`` reads the launcher's failures; ``support_files`` are written first (the
    family's ssh agent). ``shown_ranks``: the ranks whose output the console shows (None: all);
    ``ranks_to_stderr``: the ranks' stdout goes to stderr (stdout is a report's);
    ``on_progress``: told as the ranks start; ``on_lost_host``: told of each host whose link
    was lost, instead of stopping the job (an elastic job's driver)."""
    if output_dir is not None:
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DtlaunchError(f"--output-dir: cannot create {output_dir}: "
                                f"{exc.strerror or exc}") from None
    for path, text in support_files:
        write_private_executable(path, text)
    out = JobOutput(rank_hosts, output_dir, timestamps=prefix_timestamp, log_label=log_label,
                    new_demux=new_demux or family.new_demux, shown=shown_ranks,
                    ranks_to_stderr=ranks_to_stderr, on_progress=on_progress)
    if on_progress is not None:  # the launch stage shows at once: a stall shows as 0 of N
        on_progress(Progress(RANKS_RUNNING, 0, len(rank_hosts)))
    # Open MPI's mpirun ends the job when a rank fails; Hydra waits for the others, which may
    # wait forever for the failed one, so dtlaunch ends it on the rank's exit record.
    stop_on_rank_failure = not family.ends_job_on_rank_failure
    rank_failed: Failure | None = None
    received: list[int] = []
    # mpirun's stdout and stderr go to files, not pipes (see spool.py).
    proc, spools, lifeline_write = spawn(argv, env, stdin_pipe=stdin_data is not None)
    if stdin_data is not None:
        threading.Thread(target=_feed, args=(proc, stdin_data), daemon=True).start()
    # Set when mpirun has ended: then the pumps read what is left and stop.
    finished = threading.Event()
    pumps = [threading.Thread(target=spool.pump, args=(partial(out.feed, from_stderr=i == 1),
                                                       finished), daemon=True)
             for i, spool in enumerate(spools)]
    for thread in pumps:
        thread.start()

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        _signal(proc, signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in handled}
    deadline = time.monotonic() + timeout if timeout else None
    timed_out = False
    lost_host: str | None = None
    key_refused: str | None = None
    stopped_for: str | None = None
    stop_requested_at: float | None = None
    # A thread blocks in wait() so the job's end is seen at once; the main thread stays free
    # to run signal handlers and to enforce deadlines.
    def reap() -> None:
        proc.wait()
        finished.set()

    threading.Thread(target=reap, daemon=True).start()
    def stop(reason: str) -> None:
        announce(reason)
        _signal(proc, signal.SIGTERM)

    try:
        while not finished.wait(0.1):
            out.tick()
            now = time.monotonic()
            if out.broken_pipe and signal.SIGPIPE not in received:
                # dtlaunch's reader went away (`| head`): stop quietly, as SIGPIPE would.
                received.append(signal.SIGPIPE)
                _signal(proc, signal.SIGTERM)
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                stop(f"job still running after --timeout {timeout:g} s: stopping it"
                     if timeout_total is None else
                     f"job still running at the end of --timeout {timeout_total:g} s (all "
                     "attempts together): stopping it")
            if out.host_key_refused is not None and key_refused is None:
                key_refused = out.host_key_refused
                stop(f"ssh refused the host key of host {key_refused}: stopping the job")
            if out.lost_host is not None and on_lost_host is not None:
                # An elastic job goes on without the host: its driver is told at once.
                on_lost_host(out.lost_host)
                out.lost_host = None
            if out.lost_host is not None and lost_host is None:
                lost_host = out.lost_host
                stop(f"lost the SSH connection to host {lost_host}: stopping the job")
            if stop_on_rank_failure and rank_failed is None:
                rank_failed = first_failed_rank(out.exits, out.rank_hosts(), out.exit_times)
                if rank_failed is not None:
                    stop(f"{rank_failed.describe()}: stopping the job")
            if stop_when is not None and stopped_for is None:
                stopped_for = stop_when()
                if stopped_for is not None:
                    stop(stopped_for)
            if (received or timed_out or lost_host or key_refused or stopped_for or rank_failed) \
                    and stop_requested_at is None:
                stop_requested_at = now
            if stop_requested_at is not None and now - stop_requested_at > GRACE_SECONDS:
                announce(f"{family.launcher} did not stop in time: killing it")
                kill_session(proc)
                stop_requested_at = float("inf")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Anything still in mpirun's session (e.g. a rank that ignored SIGTERM) goes too,
        # the lifeline's guard with it.
        kill_session(proc)
        os.close(lifeline_write)
        for thread in pumps:
            thread.join()  # what mpirun wrote is all there: read to the end
        for spool in spools:
            spool.close()
        out.close()
    return replace(_ended(proc.returncode, out, family, received, timed_out, stopped_for,
                          key_refused, lost_host, rank_failed), ranks=out.job_ranks())


def _ended(code: int, out: JobOutput, family: MpiFamily, received: list[int], timed_out: bool,
           stopped_for: str | None, key_refused: str | None, lost_host: str | None,
           rank_failed: Failure | None) -> LaunchResult:
    """How the job ended, from what the loop and the output saw."""
    if lost_host is None:
        # mpirun may end (Open MPI 5 at once, on its daemon's ssh exit) before the loop saw
        # the link watcher's line; the pumps have read it by now.
        lost_host = out.lost_host
    exit_code = code if code >= 0 else 128 - code
    failure = family.parse_failure(list(out.launcher_lines), out.rank_hosts()) if code != 0 else None
    if code != 0 and out.not_started and (failure is None or failure.rank in out.not_started):
        # The rank shim ran but the program could not: say so as mpirun says it of the shim.
        rank = failure.rank if failure is not None and failure.rank is not None \
            else min(out.not_started)
        host = out.rank_hosts()[rank] if rank < len(out.rank_hosts()) else None
        failure = Failure(rank=rank, host=host, reason=f"rank {rank} could not start"
                          f"{f' on host {host}' if host else ''}: {out.not_started[rank]} was "
                          "not found or is not executable there")
    if received or timed_out:
        # Hydra reports the ranks it stopped as failures; they are not the job's fault.
        kept = failure if family.ends_job_on_rank_failure else None
        if received:
            return LaunchResult(exit_for_signal(received[0]), kept, interrupted_by=received[0])
        return LaunchResult(EXIT_TIMEOUT, kept, timed_out=True)
    if stopped_for is not None:
        return LaunchResult(exit_code or 1, Failure(reason=stopped_for))
    key_refused = key_refused or out.host_key_refused
    if key_refused is not None:
        # A changed or unknown key, not a lost host: the fix is the user's, and a restart would
        # be refused again.
        return LaunchResult(exit_code or 1, Failure(host=key_refused, final="host-key", reason=(
            f"ssh refused the host key of host {key_refused} (Host key verification failed): "
            "its key changed or is not in known_hosts; if the change is expected, remove the "
            "old key (ssh-keygen -R, as ssh's message says) and check the new one, or see "
            "'dtlaunch doctor' with the same hosts")))
    if lost_host is not None:
        lost = Failure(host=lost_host, reason=f"lost the SSH connection to host {lost_host}")
        return LaunchResult(exit_code or 1, lost)
    if rank_failed is None and (failure is None or failure.rank is None):
        rank_failed = first_failed_rank(out.exits, out.rank_hosts(), out.exit_times)
    if rank_failed is not None:
        # The ranks' own exit records name rank, host and status exactly.
        failure = rank_failed
        if exit_code == 0 or not family.ends_job_on_rank_failure:
            exit_code = rank_failed.exit_code or (128 + (rank_failed.signal or 0)) or 1
    if exit_code != 0 and failure is None:
        failure = Failure(reason=f"{family.launcher} exited with status {exit_code}")
    return LaunchResult(exit_code, failure)


def first_failed_rank(exits: Mapping[int, str], rank_hosts: Sequence[str],
                      times: Mapping[int, float] | None = None) -> Failure | None:
    """The rank whose exit record says it failed (`exit 3`, `signal 9`) first: by the time its
    host gave, else in the order the records came."""
    from dtlaunch.run.failure_report import RankEnd

    ends = [RankEnd(rank, rank_hosts[rank] if 0 <= rank < len(rank_hosts) else "", how,
                    (times or {}).get(rank), index)
            for index, (rank, how) in enumerate(exits.items())]
    first = first_in_time(ends)
    return first.failure() if first is not None else None


def write_private_executable(path: str, text: str) -> None:
    """The launcher's support program (Hydra's ssh agent), written privately
    (dtlaunch.core.private_files)."""
    try:
        write_private_program(path, text)
    except NotPrivate as exc:
        raise DtlaunchError(f"{os.path.dirname(path)} is not yours alone: {exc}; remove it or make it "
                            "0700") from None
    except OSError as exc:
        raise DtlaunchError(f"cannot write {path}: {exc.strerror or exc}") from None
