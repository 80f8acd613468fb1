"""Inside a Slurm job, notice an allocated node that stops answering while the job runs.

Over SSH each node has an ssh link with keepalives to watch. With plm slurm there is none:
mpirun's daemons talk to it over TCP without keepalives, and slurmctld declares a silent node
down only after SlurmdTimeout (minutes). Measured on the test bed: after one node's link went
down, slurmctld killed the daemons' step 160 s later, mpirun then reported a *healthy* node
as lost and hung for good.

So while the job runs, one extra srun step (`--overlap`, one task per node) echoes a heartbeat:
dtlaunch writes a line to srun's stdin every INTERVAL seconds, srun hands it to every task
(`--input=all`), and each task answers with its node's name. A node whose answer is more than
SILENCE seconds late, while another node still answers, is lost. The tasks end on their own
when the heartbeat stops (EOF, or nothing for TASK_PATIENCE seconds), so no task outlives the
job even if srun is killed. The step starts DELAY seconds after mpirun, so short jobs never
pay for it; single-node jobs are not watched (there is no other node to compare with).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dtlaunch.core.failure import Failure

if TYPE_CHECKING:
    from dtlaunch.run.execute import LaunchResult

DELAY = 3.0  # seconds after mpirun starts
INTERVAL = 2.0  # between heartbeats
SILENCE = 12.0  # a node this late is lost
STARTUP = 40.0  # the step's first answers may take this long (slurmctld, then each slurmd)
TASK_PATIENCE = 20  # a task with no heartbeat for this long ends itself
# Fixed code (no user input): answer each line on stdin with this node's name.
TASK_CODE = (
    "import os,select,sys\n"
    "n=os.environ.get('SLURMD_NODENAME') or os.uname().nodename\n"
    f"while select.select([sys.stdin],[],[],{TASK_PATIENCE})[0] and sys.stdin.readline():\n"
    " print(n,flush=True)\n"
)


def watch_argv(nodes: Sequence[str], python: str, srun: str = "srun") -> tuple[str, ...]:
    from dtlaunch.cluster.slurm import build_srun_probe_argv  # Slurm's jobs only

    argv = build_srun_probe_argv(nodes, (python, "-c", TASK_CODE), job_name="dtlaunch-watch",
                                 srun=srun)
    return (argv[0], "--input=all", *argv[1:])


_FAILED_ON = re.compile(r"(?:failed on node|Node failure on|cannot communicate with node)\s+"
                        r"([A-Za-z0-9_.-]+)")


def failed_node(line: str, nodes: Sequence[str]) -> str | None:
    """The node an srun error line says it could not reach, if it is one of ours. Pure."""
    match = _FAILED_ON.search(line)
    name = match.group(1).rstrip(":.") if match else None
    return name if name in nodes else None


def silent_nodes(last_seen: dict[str, float], nodes: Sequence[str], started: float,
                 now: float) -> list[str]:
    """Nodes that are SILENCE seconds late while another node answered within SILENCE (when
    every node is late, the launcher or srun stalled: no node is blamed). Pure."""
    def late(node: str) -> bool:
        seen = last_seen.get(node)
        return now - started > STARTUP if seen is None else now - seen > SILENCE

    fresh = [n for n in nodes if n in last_seen and not late(n)]
    return [n for n in nodes if late(n)] if fresh else []


class NodeWatch:
    """Polled while the job runs (``stop_reason``, execute's `stop_when`) like the host-key watch."""

    def __init__(self, nodes: Sequence[str], python: str, srun: str = "srun",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nodes = tuple(nodes)
        self.argv = watch_argv(nodes, python, srun)
        self.clock = clock
        self.created = clock()
        self.started: float | None = None
        self.last_seen: dict[str, float] = {}
        self.lost: str | None = None
        self.failed: str | None = None  # a node srun said it could not reach
        self._proc: subprocess.Popen[str] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def _start(self) -> None:
        try:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True)
        except OSError:
            return  # no srun: the job still runs, just unwatched
        self.started = self.clock()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _read(self) -> None:
        """The tasks' answers (`0: h1`), and srun's errors: srun names a node it cannot start
        the step on (one already gone when the watch starts), and that node is lost too."""
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            node = failed_node(line, self.nodes)
            if node is not None:
                self.failed = self.failed or node
                continue
            _, _, name = line.strip().partition(": ")
            if name in self.nodes:
                with self._lock:
                    self.last_seen[name] = self.clock()

    def _beat(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        while not self._stop.is_set():
            try:
                self._proc.stdin.write("\n")
                self._proc.stdin.flush()
            except (OSError, ValueError):
                return
            self._stop.wait(INTERVAL)

    def stop_reason(self) -> str | None:
        now = self.clock()
        if self.started is None:
            if now - self.created >= DELAY and self._proc is None:
                self._start()
            return None
        if self.lost is not None:
            return None  # said once
        if self.failed is not None:
            self.lost = self.failed
            return f"lost node {self.lost}: srun cannot reach it; stopping the job"
        with self._lock:
            silent = silent_nodes(self.last_seen, self.nodes, self.started, now)
        if not silent:
            return None
        self.lost = silent[0]
        return f"{lost_reason(self.lost)}; stopping the job"

    def close(self) -> None:
        """EOF ends the healthy nodes' tasks at once; srun then gets a few seconds (it may wait
        for a dead node) before its session is killed."""
        self._stop.set()
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.close()
        for sig, wait in ((None, 3.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait)
                return


def lost_reason(node: str) -> str:
    return f"lost node {node}: no heartbeat through srun for {SILENCE:g} s"


def node_watch_for(via: str, hosts: Sequence[str], python: str) -> NodeWatch | None:
    """The watch for a launch through Slurm on two or more nodes; None otherwise."""
    if via != "slurm" or len(set(hosts)) < 2:
        return None
    return NodeWatch(list(dict.fromkeys(hosts)), python, shutil.which("srun") or "srun")


# Slurm job states after which the allocation is gone (squeue's long names). COMPLETING is
# one too, seen from inside: the job's steps are being killed while its salloc or batch
# script (dtlaunch) still runs, which only scancel, the time limit or a failure does.
_ENDED_STATES = ("CANCELLED", "TIMEOUT", "DEADLINE", "FAILED", "NODE_FAIL", "PREEMPTED",
                 "BOOT_FAIL", "OUT_OF_MEMORY", "COMPLETED", "REVOKED", "COMPLETING")
_FIELD = re.compile(r"\b(JobState|Reason|RunTime|TimeLimit)=(\S+)")


def _seconds(text: str) -> float | None:
    """Slurm's [days-]hours:minutes:seconds (or minutes:seconds); None for UNLIMITED."""
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    if not all(p.isdigit() for p in parts) or (days and not days.isdigit()) or len(parts) > 3:
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return total + int(days or 0) * 86400


def parse_job_end(text: str) -> str | None:
    """How a job ended from `scontrol show job -o`: its state, where COMPLETING is read as
    TIMEOUT past the time limit, CANCELLED without another reason. None while it runs. Pure."""
    fields: dict[str, str] = dict(_FIELD.findall(text))
    state = fields.get("JobState")
    if state not in _ENDED_STATES:
        return None
    if state == "COMPLETING":
        run, limit = _seconds(fields.get("RunTime", "")), _seconds(fields.get("TimeLimit", ""))
        if run is not None and limit is not None and run >= limit:
            return "TIMEOUT"
        reason = fields.get("Reason", "None")
        return "CANCELLED" if reason == "None" else reason
    return state


def allocation_end(job_id: str, scontrol: str = "scontrol", timeout: float = 10.0) -> str | None:
    """How the Slurm job `job_id` ended, when it has (its state: CANCELLED, TIMEOUT, ...;
    "gone" when slurmctld no longer knows it); None while it runs or when nobody can tell."""
    from dtlaunch.core.bounded import run_bounded

    try:
        code, out = run_bounded([scontrol, "show", "job", "-o", job_id], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if code != 0:
        return "gone" if "Invalid job id" in out else None
    return parse_job_end(out)


_ENDED_HOW = {"CANCELLED": "was cancelled (scancel)", "TIMEOUT": "reached its time limit",
              "DEADLINE": "reached its time limit", "gone": "has ended (slurmctld no longer knows it)"}


def blame_allocation(result: LaunchResult, job_id: str | None,
                     end: Callable[[str], str | None] = allocation_end) -> LaunchResult:
    """A job that failed inside a Slurm allocation that has itself ended (scancel, its time
    limit) failed because of that, not of the node mpirun happened to name."""
    if job_id is None or result.exit_code == 0 or result.stopped:
        return result
    state = end(job_id)
    if state is None:
        return result
    how = _ENDED_HOW.get(state, f"has ended ({state})")
    return replace(result, failure=Failure(reason=f"the Slurm job {job_id} {how}",
                                           final="allocation"))


def blame(result: LaunchResult, watch: NodeWatch | None) -> LaunchResult:
    """A job the watch stopped failed because of the lost node: say so, naming it (the restart
    loop drops a node named this way)."""
    if watch is None or watch.lost is None or result.stopped:
        return result
    return replace(result, exit_code=result.exit_code or 1,
                   failure=Failure(host=watch.lost, reason=lost_reason(watch.lost)))
