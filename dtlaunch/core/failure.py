"""What failed in a job, as one value every MPI family and the restart policy speak: the rank,
its host, its exit status or signal, or the reason when it was not a rank's exit."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Failure:
    rank: int | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""  # for failures that are not a rank's exit (lost daemon, ssh failure)
    option: str | None = None  # an option the launcher refused, as it names it
    # A failure no restart can help, as the restart loop's stop kind: "host-key" (ssh refused
    # `host`'s key; it would again), "allocation" (the Slurm job itself ended: no node left).
    final: str | None = None

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a process"
        where = f" on host {self.host}" if self.host else ""
        if self.signal is not None:
            return f"{who}{where} was killed by signal {self.signal} ({signal_name(self.signal)})"
        if self.exit_code is not None:
            return f"{who}{where} exited with code {self.exit_code}"
        return self.reason or f"{who}{where} failed"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def unknown_option(launcher: str, option: str) -> Failure:
    return Failure(option=option, reason=f"{launcher} does not take the option {option} "
                   f"('{launcher} --help' lists those it does)")


def blame_mpi_args(failure: Failure, mpi_args: Sequence[str]) -> Failure:
    """Say whether a refused option came from --mpi-args. One that did not is dtlaunch's own,
    taken out of place when an option in --mpi-args lacked its value and took the next word."""
    if failure.option is None or not mpi_args:
        return failure
    bare = failure.option.lstrip("-")
    if any(arg.startswith("-") and arg.lstrip("-") == bare for arg in mpi_args):
        return replace(failure, reason=f"{failure.reason}; it came from --mpi-args")
    return replace(failure, reason=f"{failure.reason}; it is not one of --mpi-args, so an "
                   f"option there probably lacks its value ({shlex.join(mpi_args)})")
