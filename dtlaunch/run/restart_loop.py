"""`dtlaunch run --max-restarts N`: the one loop that runs a job's attempts.

`launch(attempt)` runs one attempt to its end (session.launch_attempt: a single run, its signals
its own); `restarts.decide` says whether another follows and where; its hosts then get the full
pre-flight again (`recheck`: never the cache, a host that just failed must prove itself) and
--restart-delay is waited. A signal between attempts ends the loop (128 + its number) as one
during an attempt does; --timeout is the whole job's, every attempt, re-check and delay together
(exit 124). The exit status is the last attempt's.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType

from dtlaunch.core.errors import EXIT_TIMEOUT, DtlaunchError
from dtlaunch.core.failure import signal_name
from dtlaunch.core.interrupts import Interrupted
from dtlaunch.job.hosts import Host
from dtlaunch.run.events import Event, EventLevel, OnEvent
from dtlaunch.run.restarts import (
    EXIT_SIGNAL_BASE,
    Attempt,
    AttemptOutcome,
    AttemptRecord,
    RestartPolicy,
    RestartReport,
    Stop,
    decide,
    without,
)

Launch = Callable[[Attempt], AttemptOutcome]
# (hosts, seconds left of --timeout) -> failing host -> why; a signal raises (KeyboardInterrupt,
# Interrupted), a DtlaunchError (a changed host key) stops everything.
Recheck = Callable[[tuple[Host, ...], "float | None"], Mapping[str, str]]
Wait = Callable[[float], "int | None"]  # seconds -> the signal that cut it short

_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def wait_for_signal(seconds: float) -> int | None:
    """Wait, returning at once with the first signal that ends dtlaunch, if one arrives."""
    received: list[int] = []
    arrived = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        arrived.set()

    previous = {sig: signal.signal(sig, handler) for sig in _HANDLED}
    try:
        arrived.wait(max(seconds, 0.0))
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return received[0] if received else None


def run_attempts(first: Attempt, policy: RestartPolicy, launch: Launch, recheck: Recheck | None,
                 on_event: OnEvent, *, wait: Wait = wait_for_signal,
                 clock: Callable[[], float] = time.time) -> RestartReport:
    """Attempts from `first` until one ends the job (see restarts.decide). `recheck` None
    (--no-check): hosts are not checked between attempts. `wait(seconds)` is asked before every
    restart, even with no delay, whether a signal arrived."""
    records: list[AttemptRecord] = []

    def note(text: str) -> None:
        on_event(Event(EventLevel.NOTE, f"[{time.strftime('%H:%M:%S')}] {text}"))

    stop, exit_code = _loop(first, policy, launch, recheck, wait, clock, note, records)
    note(stop.reason)
    return RestartReport(tuple(records), exit_code, stop, policy.max_restarts)


def _loop(first: Attempt, policy: RestartPolicy, launch: Launch, recheck: Recheck | None,
          wait: Wait, clock: Callable[[], float], note: Callable[[str], None],
          records: list[AttemptRecord]) -> tuple[Stop, int]:
    """Why the job stopped and its exit status; each attempt is added to `records`."""
    attempt, recheck_s, waited_s, deadline = first, 0.0, 0.0, first.deadline
    while True:
        names = tuple(h.name for h in attempt.hosts)
        started = clock()
        note(f"attempt {attempt.number + 1}: {attempt.num_proc} rank(s) on {','.join(names)}")
        outcome = launch(attempt)
        records.append(AttemptRecord(attempt.number, started, clock() - started, names,
                                     attempt.num_proc, outcome.describe(), outcome.exit_code,
                                     attempt.dropped, recheck_s, waited_s))
        note(f"attempt {attempt.number + 1} ended: {outcome.describe()} "
             f"(exit {outcome.exit_code})")
        step = decide(outcome, attempt, policy)
        for name, why in step.dropped:
            note(f"dropping {name}: {why}")
        recheck_s = 0.0
        if isinstance(step, Attempt) and recheck is not None:
            checked = clock()
            note(f"re-checking {','.join(h.name for h in step.hosts)}")
            try:
                failing = recheck(step.hosts, None if deadline is None else deadline - clock())
            except (KeyboardInterrupt, Interrupted) as exc:
                return _interrupted(exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
            except DtlaunchError as exc:  # e.g. a changed host key: nothing more should run
                return Stop("recheck-error", f"re-check failed: {exc}"), outcome.exit_code
            recheck_s = clock() - checked
            note(f"re-check done in {recheck_s:.1f} s")
            if _late(deadline, clock):
                return _timeout("during the re-check")
            for name, why in failing.items():
                note(f"dropping {name}: {why}")
            step = without(step, failing, policy)
        if isinstance(step, Stop):
            return step, outcome.exit_code
        if policy.delay > 0:
            note(f"restarting in {policy.delay:g} s")
        waited = clock()
        signum = wait(policy.delay if deadline is None
                      else min(policy.delay, max(deadline - waited, 0.0)))
        waited_s = clock() - waited
        if signum is not None:
            return _interrupted(signum)
        if _late(deadline, clock):
            return _timeout("before a restart")
        attempt = step


def _late(deadline: float | None, clock: Callable[[], float]) -> bool:
    return deadline is not None and clock() >= deadline


def _timeout(when: str) -> tuple[Stop, int]:
    return Stop("timeout", f"--timeout reached {when}; the time limit covers every attempt, "
                           "re-check and delay: not restarting"), EXIT_TIMEOUT


def _interrupted(signum: int) -> tuple[Stop, int]:
    return Stop("interrupted", f"stopped by {signal_name(signum)} before a restart"), \
        EXIT_SIGNAL_BASE + signum
