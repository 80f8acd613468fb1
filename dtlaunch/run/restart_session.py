"""`dtlaunch run --max-restarts N`: the restart loop (dtlaunch.run.restarts) driven by real attempts.

Each attempt is one single run: `launch` (session.launch, handed in by session.start with its
`prepare` and `recheck`, so the loop needs nothing above it). Between attempts the
remaining hosts get the full pre-flight again (never the cache: a host that just failed must
prove itself), and a signal that arrives between attempts ends the loop like one that arrives
during an attempt.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import FrameType
from typing import TYPE_CHECKING

from dtlaunch.core.errors import EXIT_TIMEOUT
from dtlaunch.core.failure import Failure
from dtlaunch.core.interrupts import Interrupted
from dtlaunch.job.hosts import Host
from dtlaunch.run.events import Event, EventLevel, OnEvent
from dtlaunch.run.restarts import (
    AttemptOutcome,
    RestartEvent,
    RestartPolicy,
    RestartReport,
    check_policy,
    outcome_from_launch,
    run_with_restarts,
    with_restart_count,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from dtlaunch.plan.plan import RunRequest
    from dtlaunch.run.session import LaunchRequest, Prepared, RunOutcome

    Launch = Callable[[LaunchRequest, OnEvent], RunOutcome]  # session.launch
    Prepare = Callable[[RunRequest, OnEvent], Prepared]  # session.prepare
    # session.recheck: (request, hosts, seconds left of --timeout) -> failing host -> why
    Recheck = Callable[[LaunchRequest, tuple[Host, ...], float | None], Mapping[str, str]]

_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class RestartOutcome:
    """The attempts and why the loop stopped: the CLI shows them (console/render.py) and
    writes them to --output-dir/attempts.json."""

    report: RestartReport
    exit_code: int


class _PendingSignals:
    """Signals that end the loop between attempts (during one, the attempt's own handlers
    take them and the attempt comes back interrupted)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.arrived = threading.Event()

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        self.arrived.set()

    def sleep(self, seconds: float) -> int | None:
        """Wait, returning at once with the first signal that arrives (or already arrived)."""
        previous = {sig: signal.signal(sig, self.handler) for sig in _HANDLED}
        try:
            if not self.received:
                self.arrived.wait(seconds if seconds > 0 else 0)
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        return self.received[0] if self.received else None


def launch_with_restarts(request: LaunchRequest, policy: RestartPolicy, on_event: OnEvent, *,
                         launch: Launch, prepare: Prepare, recheck: Recheck) -> RestartOutcome:
    """Attempts of `request` under `policy`, each one `launch` (session.launch); `prepare`
    (session.prepare) plans the first attempt's hosts; `recheck` (session.recheck) checks the
    hosts left before each restart."""
    # The attempts keep the slots planned here: one per GPU needs the pre-flight first, which
    # the loop does not run before it starts, so hosts without written slots keep 1.
    request = replace(request, run=replace(request.run, hosts=tuple(
        Host(h.name, h.slots) for h in request.run.hosts)))
    first = prepare(request.run, on_event).plan
    check_policy(policy, len(first.rank_hosts))
    pending = _PendingSignals()
    # --timeout is the whole job's: each attempt gets what is left of it.
    deadline = time.time() + request.timeout if request.timeout is not None else None

    def time_left() -> float | None:
        return None if deadline is None else deadline - time.time()

    def run_attempt(hosts: tuple[Host, ...], num_proc: int, count: int) -> AttemptOutcome:
        if pending.received:
            return AttemptOutcome(128 + pending.received[0], interrupted_by=pending.received[0])
        left = time_left()
        if left is not None and left <= 0:
            return AttemptOutcome(EXIT_TIMEOUT, timed_out=True)
        run = replace(request.run, hosts=hosts, num_proc=num_proc,
                      env_items=with_restart_count(request.run.env_items, count))
        # The first attempt runs the ordinary pre-flight; later ones were re-checked just before.
        outcome = launch(replace(request, run=run, check=request.check and count == 0,
                                 deadline=deadline,
                                 log_label=f"attempt {count + 1} (DTLAUNCH_RESTART_COUNT={count})"),
                         on_event)
        if outcome.result is None:
            for line in (outcome.error or "pre-flight checks failed").splitlines():
                on_event(Event(EventLevel.NOTE, line))
            return AttemptOutcome(outcome.exit_code, Failure(reason=outcome.error or "pre-flight"))
        if outcome.report is not None and outcome.exit_code != 0:
            # Each failed attempt's root cause, as a single run reports it.
            on_event(Event(EventLevel.REPORT, f"attempt {count + 1} ended", report=outcome.report))
        return outcome_from_launch(outcome.result)

    def recheck_hosts(hosts: tuple[Host, ...]) -> Mapping[str, str]:
        if not request.check:
            return {}
        try:
            return recheck(request, hosts, time_left())
        except KeyboardInterrupt:  # ends the loop at the sleep that follows
            pending.handler(signal.SIGINT, None)
        except Interrupted as exc:
            pending.handler(exc.signum, None)
        return {}

    def show(event: RestartEvent) -> None:
        on_event(Event(EventLevel.NOTE, f"[{time.strftime('%H:%M:%S')}] {event.text}"))

    report = run_with_restarts(first.hosts, len(first.rank_hosts), policy, run_attempt,
                               recheck_hosts, pending.sleep, on_event=show, deadline=deadline)
    return RestartOutcome(report, report.exit_code)
