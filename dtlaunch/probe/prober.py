"""How hosts are reached for checks (the seam), and one fan-out with an overall deadline.

A `Prober` runs the probe on one host and returns what it found: over SSH (ssh_prober.py), or
`srun` inside a Slurm allocation (srun_prober.py); a `Tracker` (dtlaunch.core.tracker) holds
what a prober has open, for `close()`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from dtlaunch.core.tracker import Tracker
from dtlaunch.job.hosts import local_names as local_names  # probed directly, not by a Prober

if TYPE_CHECKING:
    from dtlaunch.check.facts import HostFacts
    from dtlaunch.check.report import HostOutcome
    from dtlaunch.probe.command import ProbeArgs

MAX_PARALLEL = 64

T = TypeVar("T")
R = TypeVar("R")


class Prober(Protocol):
    """Reaches remote hosts for doctor and the pre-flight. Every call is bounded in time."""

    connect_timeout: float

    def prepare(self) -> None:
        """Import, on the calling thread, every module `probe` and `verify` need: the fan-out's
        threads then import nothing. Python before 3.14 can raise _DeadlockError to two threads
        that import nested modules at once (CPython gh-83065)."""
        ...

    def probe(self, host: str, args: ProbeArgs, timeout: float) -> HostOutcome:
        """Run the probe on `host`; facts, or the problem that stopped it (never raises; the
        caller times it)."""
        ...

    def verify(self, host: str) -> str | None:
        """The cheap check a cached pre-flight keeps (SSH: the host key); a failure kind or None."""
        ...

    def close(self) -> None:
        """End every connection, helper process and remote command still open (Ctrl-C)."""
        ...


@dataclass(frozen=True)
class Reach:
    """How a round of checks reaches the hosts: a fresh Prober for each round, and the probe
    of this machine (run directly, ended through the Tracker). Tests hand in fakes."""

    prober: Callable[[], Prober]
    here: Callable[[ProbeArgs, float, Tracker], HostFacts]


def fan_out(items: Sequence[T], work: Callable[[T], R], fallback: Callable[[T, BaseException | None], R],
            seconds: float, on_result: Callable[[int, T], None] | None = None,
            while_waiting: Callable[[], None] | None = None,
            max_parallel: int = MAX_PARALLEL) -> list[R]:
    """`work(item)` for every item at once; results in the items' order, within `seconds`.

    `fallback(item, exc)` stands in for work that raised (exc) or is still running at the
    deadline (None). `on_result(done, item)` reports progress; `while_waiting` runs once on
    this thread after everything started. Ctrl-C propagates at once (the threads are daemons;
    the caller ends what they hold open)."""
    deadline = time.monotonic() + seconds
    done: queue.Queue[tuple[int, R]] = queue.Queue()
    slots = threading.BoundedSemaphore(max(1, max_parallel))

    def run(index: int, item: T) -> None:
        with slots:
            try:
                result = work(item)
            except BaseException as exc:  # always report, or the waiter would wait in vain
                result = fallback(item, exc)
            done.put((index, result))

    for index, item in enumerate(items):
        threading.Thread(target=run, args=(index, item), daemon=True).start()
    if while_waiting is not None:
        with contextlib.suppress(Exception):
            while_waiting()
    results: dict[int, R] = {}
    while len(results) < len(items):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            index, result = done.get(timeout=min(left, 0.1))
        except queue.Empty:
            continue
        results[index] = result
        if on_result is not None:
            on_result(len(results), items[index])
    return [results[i] if i in results else fallback(item, None) for i, item in enumerate(items)]
