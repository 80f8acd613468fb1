"""`dtlaunch run --max-restarts N`: after a failed attempt, whether the job starts again and on
which hosts, and the one loop that runs a job's attempts. `decide` is pure: it looks at how an
attempt ended and returns the next attempt or why there is none.

The rules, in order:
- success, the user's interrupt (SIGINT/SIGTERM/SIGHUP) and ``--timeout`` end the job; a host
  key ssh refused, a lost allocation and an option the launcher refused would fail again;
- no restarts left, or the same failure twice in a row (a bug, not bad luck), end it early;
- a lost host is dropped; the host of a rank killed by a signal is dropped unless it is the only
  one left (a one-machine job is restarted where it is, and the re-check decides);
- the remaining hosts are re-checked and those that fail are dropped (`without`);
- ``-np`` shrinks to the slots that remain (never grows back); fewer than ``--min-np`` stops.

The loop (`run_attempts`): `launch(attempt)` runs one attempt to its end
(session.launch_attempt: a single run, its signals its own); `decide` says whether another
follows and where; its hosts then get the full pre-flight again (`recheck`: never the cache, a
host that just failed must prove itself) and --restart-delay is waited. A signal between
attempts ends the loop (128 + its number) as one during an attempt does; --timeout is the whole
job's, every attempt, re-check and delay together (exit 124). The exit status is the last
attempt's.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import FrameType

from dtlaunch.core.errors import EXIT_TIMEOUT, DtlaunchError, UsageError, exit_for_signal
from dtlaunch.core.failure import Failure, signal_name
from dtlaunch.core.interrupts import Interrupted
from dtlaunch.job.hosts import Host, total_slots
from dtlaunch.run.events import Event, EventLevel, OnEvent

RESTART_COUNT_ENV = "DTLAUNCH_RESTART_COUNT"
MAX_RESTARTS_LIMIT = 1000  # more is a typo; a loop this long would hide a broken cluster
Dropped = tuple[tuple[str, str], ...]  # (host, why), in the order they were dropped


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 0
    min_np: int = 1
    delay: float = 0.0  # seconds to wait before each restart
    oversubscribe: bool = False  # -np may exceed slots: keep it when hosts are dropped


def check_policy(policy: RestartPolicy, num_proc: int | None) -> RestartPolicy:
    """Reject options that cannot mean anything; ``num_proc`` is the first attempt's -np
    (None: not known yet, e.g. before the hosts are)."""
    if not 0 <= policy.max_restarts <= MAX_RESTARTS_LIMIT:
        raise UsageError(f"--max-restarts: must be between 0 and {MAX_RESTARTS_LIMIT}, "
                         f"got {policy.max_restarts}")
    if policy.min_np < 1:
        raise UsageError(f"--min-np: must be at least 1, got {policy.min_np}")
    if num_proc is not None and policy.min_np > num_proc:
        raise UsageError(f"--min-np {policy.min_np} is more than the job's {num_proc} processes")
    if not policy.delay >= 0:  # also rejects NaN
        raise UsageError(f"--restart-delay: must be 0 or more seconds, got {policy.delay}")
    return policy


@dataclass(frozen=True)
class AttemptOutcome:
    """How one attempt ended, as dtlaunch saw it (the MPI launcher's status, or the ranks')."""

    exit_code: int
    failure: Failure | None = None
    interrupted_by: int | None = None  # a signal dtlaunch itself received
    timed_out: bool = False

    def describe(self) -> str:
        if self.interrupted_by is not None:
            return f"stopped by {signal_name(self.interrupted_by)}"
        if self.timed_out:
            return "ran longer than --timeout"
        if self.exit_code == 0:
            return "finished"
        if self.failure is not None:
            return self.failure.describe()
        return f"mpirun exited with status {self.exit_code}"


@dataclass(frozen=True)
class Attempt:
    """One attempt of the job: what its launch is given, and why it was started. A restart is
    the next Attempt (`decide`)."""

    number: int  # 0 for the first: the restart count its ranks see (DTLAUNCH_RESTART_COUNT)
    hosts: tuple[Host, ...]
    num_proc: int
    deadline: float | None = None  # --timeout's end (time.time()): the whole job's, every attempt's
    dropped: Dropped = ()  # hosts dropped before it
    after: AttemptOutcome | None = None  # how the attempt before it ended: a repeat stops


@dataclass(frozen=True)
class Stop:
    kind: str  # finished interrupted timeout refused-option host-key allocation
    # no-restarts-left repeated no-hosts min-np recheck-error
    reason: str
    dropped: Dropped = ()  # hosts dropped on the way to this stop (too few were left)


# ---------------------------------------------------------------- the decision


def decide(outcome: AttemptOutcome, attempt: Attempt, policy: RestartPolicy) -> Attempt | Stop:
    """After `attempt` ended with `outcome`: the next attempt, without the hosts the failure
    points at, or why there is none. Its hosts are re-checked before it starts (`without`)."""
    if outcome.interrupted_by is not None:
        return Stop("interrupted", outcome.describe())
    if outcome.timed_out:
        return Stop("timeout", "the job ran longer than --timeout; a timeout is never restarted")
    if outcome.exit_code == 0:
        return Stop("finished", "finished")
    failure = outcome.failure
    if failure is not None and failure.final is not None:
        why = {"host-key": "ssh would refuse it again; a changed key is never taken for a lost "
                           "host",
               "allocation": "its nodes went with it: nothing to re-check or restart on"}
        return Stop(failure.final, f"{outcome.describe()}; not restarting "
                                   f"({why.get(failure.final, 'final')})")
    if failure is not None and failure.option is not None:
        return Stop("refused-option", f"{outcome.describe()}; the same command line would be "
                                      "refused again: not restarting")
    if attempt.number >= policy.max_restarts:
        return Stop("no-restarts-left",
                    f"no restarts left (--max-restarts {policy.max_restarts}): {outcome.describe()}")
    signature = failure_signature(outcome)
    if attempt.after is not None and signature is not None \
            and signature == failure_signature(attempt.after):
        return Stop("repeated", f"failed the same way twice in a row ({outcome.describe()}); "
                                "not restarting what looks like a bug in the script")
    blamed = blame_hosts(outcome, attempt.hosts)
    return without(Attempt(attempt.number + 1, attempt.hosts, attempt.num_proc,
                           attempt.deadline, after=outcome), blamed, policy)


def without(attempt: Attempt, dropping: Mapping[str, str], policy: RestartPolicy,
            ) -> Attempt | Stop:
    """`attempt` without the hosts in `dropping` (name -> why: those the failure points at, then
    those that failed the re-check), -np cut to the slots left, or why it cannot run."""
    hosts = tuple(h for h in attempt.hosts if h.name not in dropping)
    dropped = (*attempt.dropped, *dropping.items())
    if not hosts:
        return Stop("no-hosts", "no host left to restart on", dropped)
    slots = total_slots(hosts)
    np = attempt.num_proc if policy.oversubscribe else min(attempt.num_proc, slots)
    if np < policy.min_np:
        names = ",".join(h.name for h in hosts)
        return Stop("min-np", f"only {slots} slot(s) left ({names}), fewer than "
                              f"--min-np {policy.min_np}", dropped)
    return replace(attempt, hosts=hosts, num_proc=np, dropped=dropped)


def failure_signature(outcome: AttemptOutcome) -> tuple[object, ...] | None:
    """What makes two failures 'the same': a lost host is bad luck, never a repeat."""
    f = outcome.failure
    if outcome.exit_code == 0 or is_lost_host(f):
        return None
    if f is None:
        return ("status", outcome.exit_code)
    if f.signal is not None:  # ranks are renumbered when a host is dropped: the signal only
        return ("signal", f.signal)
    if f.exit_code is not None:
        return ("exit", f.rank, f.exit_code)
    return ("other", f.reason)


def is_lost_host(failure: Failure | None) -> bool:
    return (failure is not None and failure.host is not None and failure.rank is None
            and failure.signal is None and failure.exit_code is None and failure.final is None)


def blame_hosts(outcome: AttemptOutcome, hosts: Sequence[Host]) -> dict[str, str]:
    """Hosts the failure points at (name -> why): a lost host, the host of a signalled rank."""
    f = outcome.failure
    if f is None or f.host is None or not (is_lost_host(f) or f.signal is not None):
        return {}
    found = [h for h in hosts if h.name == f.host]
    if not found:
        # mpirun may name a node by its full name where the host list has the short one.
        short = f.host.split(".")[0]
        found = [h for h in hosts if h.name.split(".")[0] == short]
    if not found:
        return {}
    host = found[0]
    if not is_lost_host(f) and len(hosts) == 1:  # nowhere else to go: let the re-check decide
        return {}
    return {host.name: f.describe()}


def with_restart_count(env_items: Sequence[str], restart_count: int) -> tuple[str, ...]:
    """``-x`` items for an attempt: the user's, then ours (a user's own value is replaced)."""
    kept = [item for item in env_items if item.split("=", 1)[0] != RESTART_COUNT_ENV]
    return (*kept, f"{RESTART_COUNT_ENV}={restart_count}")


# ---------------------------------------------------------------- what the loop reports


@dataclass(frozen=True)
class AttemptRecord:
    number: int  # 0-based: the DTLAUNCH_RESTART_COUNT its ranks saw
    started_at: float  # seconds since the epoch
    duration_s: float
    hosts: tuple[str, ...]
    ranks: int
    ended: str  # why it ended, one line
    exit_code: int
    dropped: Dropped = ()  # (host, why) dropped before this attempt
    recheck_s: float = 0.0  # re-checking the hosts before this attempt
    waited_s: float = 0.0  # --restart-delay before this attempt


@dataclass(frozen=True)
class RestartReport:
    attempts: tuple[AttemptRecord, ...]
    exit_code: int
    stop: Stop
    max_restarts: int


# ---------------------------------------------------------------- the loop

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
            if deadline is not None and clock() >= deadline:
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
        if deadline is not None and clock() >= deadline:
            return _timeout("before a restart")
        attempt = step


def _timeout(when: str) -> tuple[Stop, int]:
    return Stop("timeout", f"--timeout reached {when}; the time limit covers every attempt, "
                           "re-check and delay: not restarting"), EXIT_TIMEOUT


def _interrupted(signum: int) -> tuple[Stop, int]:
    return Stop("interrupted", f"stopped by {signal_name(signum)} before a restart"), \
        exit_for_signal(signum)
