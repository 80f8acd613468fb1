"""The Prober through srun, inside a Slurm allocation: no SSH at all.

Each host gets one srun step (one task on that node, `--overlap` so it runs beside a job
step) that runs the same probe script the SSH prober runs. A step still running at the
deadline gets SIGTERM (srun then cancels it on the node), then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from dtlaunch.check.report import HOST, HostOutcome, unreachable
from dtlaunch.cluster.slurm import build_srun_probe_argv, parse_srun_labeled, parse_srun_task_errors
from dtlaunch.core.tracker import Tracker
from dtlaunch.probe.command import ProbeArgs, build_probe_argv

# The probe needs PATH (the interpreter, mpirun) and HOME (its import cache).
EXPORT = ("PATH", "HOME")
CONNECT_TIMEOUT = 30.0  # srun's own start of a step (slurmctld, then the node's slurmd)
PATH = "srun"  # the reach column says how the node was reached


class _Step:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def close(self) -> None:
        """srun cancels its step on SIGTERM (one signal: a second one within a second detaches it)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)


def _failed(host: str, detail: str, hint: str) -> HostOutcome:
    return HostOutcome(host, HOST, problem=unreachable(detail, hint), path=PATH)


class SrunProber:
    def __init__(self, srun: str = "srun") -> None:
        self.srun = srun
        self.connect_timeout = CONNECT_TIMEOUT
        self._tracker = Tracker()

    def prepare(self) -> None:
        import dtlaunch.check.facts  # noqa: F401

    def probe(self, host: str, args: ProbeArgs, timeout: float) -> HostOutcome:
        from dtlaunch.check.facts import parse_probe_output

        argv = build_srun_probe_argv([host], build_probe_argv(args), export=EXPORT,
                                     srun=self.srun)
        try:
            with self._tracker.opening():
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, text=True,
                                        start_new_session=True)
                step = _Step(proc)
                self._tracker.add(step)
        except OSError as exc:
            return _failed(host, f"cannot run srun: {exc.strerror or exc}",
                           "run dtlaunch inside salloc or sbatch, with Slurm's srun on PATH")
        try:
            try:
                out, err = proc.communicate(timeout=timeout + self.connect_timeout)
            except subprocess.TimeoutExpired:
                step.close()
                proc.communicate()
                return _failed(host, f"no answer through srun within "
                               f"{timeout + self.connect_timeout:g} s",
                               f"check the node: 'scontrol show node {host}', "
                               f"'srun -w {host} -N1 hostname'")
        finally:
            self._tracker.discard(step)
        text = parse_srun_labeled(out, [host]).by_node[host]
        facts = parse_probe_output(text)
        if not facts.hostname:
            why = parse_srun_task_errors(err).get(host) or (
                (err.strip().splitlines() or [f"srun exit {proc.returncode}"])[-1])
            return _failed(host, f"the probe did not run through srun: {why}",
                           f"try 'srun -w {host} -N1 sh -c true' inside this allocation")
        return HostOutcome(host, HOST, facts, path=PATH)

    def verify(self, host: str) -> str | None:
        return None  # no host keys: Slurm authenticates with munge

    def close(self) -> None:
        self._tracker.close_all()
