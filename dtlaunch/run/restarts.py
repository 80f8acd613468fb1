"""`dtlaunch run --max-restarts N`: after a failed attempt, decide whether to start the job again
and on which hosts, and drive the attempts. Pure policy plus a loop over injected callables.

The policy, in order (``check_stop`` then ``blame_hosts``, the re-check, ``plan_next``):
- success, the user's interrupt (SIGINT/SIGTERM/SIGHUP) and ``--timeout`` end the loop; the
  time limit is the whole job's, every attempt, re-check and delay together (exit 124);
- no restarts left, or the same failure twice in a row (a bug, not bad luck), end it early;
- a lost host is dropped; the host of a rank killed by a signal is dropped unless it is the only
  one left (a one-machine job is restarted where it is, and the re-check decides);
- the remaining hosts are re-checked and those that fail are dropped;
- ``-np`` shrinks to the slots that remain (never grows back); fewer than ``--min-np`` stops.
The exit status is the last attempt's, or 128 + signal when interrupted between attempts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dtlaunch.core.errors import EXIT_TIMEOUT, DtlaunchError, UsageError
from dtlaunch.core.failure import Failure, signal_name
from dtlaunch.job.hosts import Host, total_slots

if TYPE_CHECKING:
    from dtlaunch.run.execute import LaunchResult

RESTART_COUNT_ENV = "DTLAUNCH_RESTART_COUNT"
EXIT_SIGNAL_BASE = 128
MAX_RESTARTS_LIMIT = 1000  # more is a typo; a loop this long would hide a broken cluster


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
    """How one attempt ended, as the launcher saw it."""

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


def outcome_from_launch(result: LaunchResult) -> AttemptOutcome:
    return AttemptOutcome(result.exit_code, result.failure, result.interrupted_by, result.timed_out)


@dataclass(frozen=True)
class Stop:
    kind: str  # finished interrupted timeout refused-option host-key allocation
    # no-restarts-left repeated no-hosts min-np recheck-error
    reason: str


@dataclass(frozen=True)
class Restart:
    hosts: tuple[Host, ...]
    num_proc: int


# ---------------------------------------------------------------- the pure policy


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


def check_stop(outcome: AttemptOutcome, previous: AttemptOutcome | None, restarts_used: int,
               policy: RestartPolicy) -> Stop | None:
    """Whether the loop ends after this attempt, before any host is looked at."""
    if outcome.interrupted_by is not None:
        return Stop("interrupted", outcome.describe())
    if outcome.timed_out:
        return Stop("timeout", "the job ran longer than --timeout; a timeout is never restarted")
    if outcome.exit_code == 0:
        return Stop("finished", "finished")
    if outcome.failure is not None and outcome.failure.final is not None:
        why = {"host-key": "ssh would refuse it again; a changed key is never taken for a lost "
                           "host",
               "allocation": "its nodes went with it: nothing to re-check or restart on"}
        return Stop(outcome.failure.final, f"{outcome.describe()}; not restarting "
                                           f"({why.get(outcome.failure.final, 'final')})")
    if outcome.failure is not None and outcome.failure.option is not None:
        return Stop("refused-option", f"{outcome.describe()}; the same command line would be "
                                      "refused again: not restarting")
    if restarts_used >= policy.max_restarts:
        return Stop("no-restarts-left",
                    f"no restarts left (--max-restarts {policy.max_restarts}): {outcome.describe()}")
    signature = failure_signature(outcome)
    if previous is not None and signature is not None and signature == failure_signature(previous):
        return Stop("repeated", f"failed the same way twice in a row ({outcome.describe()}); "
                                "not restarting what looks like a bug in the script")
    return None


def host_named(name: str, hosts: Sequence[Host]) -> Host | None:
    """mpirun may name a node by its full name where the host list has the short one."""
    for host in hosts:
        if host.name == name:
            return host
    short = name.split(".")[0]
    for host in hosts:
        if host.name.split(".")[0] == short:
            return host
    return None


def blame_hosts(outcome: AttemptOutcome, hosts: Sequence[Host]) -> dict[str, str]:
    """Hosts the failure points at (name -> why): a lost host, the host of a signalled rank."""
    f = outcome.failure
    if f is None or f.host is None or not (is_lost_host(f) or f.signal is not None):
        return {}
    host = host_named(f.host, hosts)
    if host is None:
        return {}
    if not is_lost_host(f) and len(hosts) == 1:  # nowhere else to go: let the re-check decide
        return {}
    return {host.name: f.describe()}


def without(hosts: Sequence[Host], dropped: Mapping[str, str]) -> tuple[Host, ...]:
    return tuple(h for h in hosts if h.name not in dropped)


def plan_next(hosts: Sequence[Host], num_proc: int, policy: RestartPolicy) -> Restart | Stop:
    """The next attempt on ``hosts`` (what remains), or why there is none."""
    if not hosts:
        return Stop("no-hosts", "no host left to restart on")
    slots = total_slots(hosts)
    np = num_proc if policy.oversubscribe else min(num_proc, slots)
    if np < policy.min_np:
        names = ",".join(h.name for h in hosts)
        return Stop("min-np", f"only {slots} slot(s) left ({names}), fewer than "
                              f"--min-np {policy.min_np}")
    return Restart(tuple(hosts), np)


def restart_env(restart_count: int) -> dict[str, str]:
    """What every rank of an attempt sees in addition to the job's environment."""
    return {RESTART_COUNT_ENV: str(restart_count)}


def with_restart_count(env_items: Sequence[str], restart_count: int) -> tuple[str, ...]:
    """``-x`` items for an attempt: the user's, then ours (a user's own value is replaced)."""
    kept = [item for item in env_items if item.split("=", 1)[0] != RESTART_COUNT_ENV]
    return (*kept, f"{RESTART_COUNT_ENV}={restart_count}")


# ---------------------------------------------------------------- records and the loop


@dataclass(frozen=True)
class AttemptRecord:
    number: int  # 0-based: the DTLAUNCH_RESTART_COUNT its ranks saw
    started_at: float  # seconds since the epoch
    duration_s: float
    hosts: tuple[str, ...]
    ranks: int
    ended: str  # why it ended, one line
    exit_code: int
    dropped: tuple[tuple[str, str], ...] = ()  # (host, why) dropped before this attempt
    recheck_s: float = 0.0  # re-checking the hosts before this attempt
    waited_s: float = 0.0  # --restart-delay before this attempt


@dataclass(frozen=True)
class RestartReport:
    attempts: tuple[AttemptRecord, ...]
    exit_code: int
    stop: Stop
    max_restarts: int


@dataclass(frozen=True)
class RestartEvent:
    """A step of the loop, for live lines and logs; ``at`` is the clock's time."""

    kind: str  # attempt-start | attempt-end | recheck-start | recheck-end | drop | wait | stop
    at: float
    text: str
    data: Mapping[str, object] = field(default_factory=dict)


RunAttempt = Callable[[tuple[Host, ...], int, int], AttemptOutcome]
Recheck = Callable[[tuple[Host, ...]], Mapping[str, str]]
Sleep = Callable[[float], "int | None"]


def run_with_restarts(
    hosts: Sequence[Host],
    num_proc: int,
    policy: RestartPolicy,
    run_attempt: RunAttempt,
    recheck: Recheck,
    sleep: Sleep,
    clock: Callable[[], float] = time.time,
    on_event: Callable[[RestartEvent], None] = lambda event: None,
    deadline: float | None = None,
) -> RestartReport:
    """Run attempts until one ends the loop (see the module doc).

    ``run_attempt(hosts, np, restart_count)`` runs one attempt to its end, handling signals
    itself (an interrupt comes back as ``interrupted_by``). ``recheck(hosts)`` returns the hosts
    that fail the pre-flight (name -> why); a KeyboardInterrupt there counts as SIGINT, and a
    DtlaunchError (a failure that must stop everything, like a changed host key) ends the loop.
    ``sleep(seconds)`` waits, returning at once with the signal number if one arrives (or is
    already pending; it is also called with 0 before every restart to ask).
    ``deadline`` (on ``clock``'s scale): ``--timeout`` for the whole job. ``run_attempt``
    bounds each attempt by it; the loop stops with exit 124 once it has passed, and waits
    for a delay no longer than what is left.
    """
    current: tuple[Host, ...] = tuple(hosts)
    records: list[AttemptRecord] = []
    previous: AttemptOutcome | None = None
    dropped: tuple[tuple[str, str], ...] = ()
    recheck_s = waited_s = 0.0

    def finish(stop: Stop, exit_code: int) -> RestartReport:
        on_event(RestartEvent("stop", clock(), stop.reason, {"kind": stop.kind,
                                                             "exit_code": exit_code}))
        return RestartReport(tuple(records), exit_code, stop, policy.max_restarts)

    def out_of_time(when: str) -> RestartReport | None:
        if deadline is None or clock() < deadline:
            return None
        return finish(Stop("timeout", f"--timeout reached {when}; the time limit covers every "
                                      "attempt, re-check and delay: not restarting"),
                      EXIT_TIMEOUT)

    while True:
        number = len(records)
        names = tuple(h.name for h in current)
        started = clock()
        on_event(RestartEvent("attempt-start", started,
                              f"attempt {number + 1}: {num_proc} rank(s) on {','.join(names)}",
                              {"attempt": number, "hosts": list(names), "ranks": num_proc}))
        outcome = run_attempt(current, num_proc, number)
        ended = clock()
        records.append(AttemptRecord(number, started, ended - started, names, num_proc,
                                     outcome.describe(), outcome.exit_code, dropped, recheck_s,
                                     waited_s))
        on_event(RestartEvent("attempt-end", ended, f"attempt {number + 1} ended: "
                              f"{outcome.describe()} (exit {outcome.exit_code})",
                              {"attempt": number, "exit_code": outcome.exit_code}))
        stop = check_stop(outcome, previous, number, policy)
        if stop is not None:
            return finish(stop, outcome.exit_code)
        previous = outcome
        blamed = blame_hosts(outcome, current)
        for name, why in blamed.items():
            on_event(RestartEvent("drop", clock(), f"dropping {name}: {why}", {"host": name}))
        remaining = without(current, blamed)
        check_started = clock()
        on_event(RestartEvent("recheck-start", check_started,
                              f"re-checking {','.join(h.name for h in remaining) or 'no host'}"))
        try:
            failing = dict(recheck(remaining)) if remaining else {}
        except KeyboardInterrupt:
            return finish(Stop("interrupted", "stopped by SIGINT"), EXIT_SIGNAL_BASE + 2)
        except DtlaunchError as exc:  # e.g. a changed host key: nothing more should run
            return finish(Stop("recheck-error", f"re-check failed: {exc}"), outcome.exit_code)
        recheck_s = clock() - check_started
        on_event(RestartEvent("recheck-end", clock(), f"re-check done in {recheck_s:.1f} s",
                              {"failing": dict(failing), "seconds": recheck_s}))
        late = out_of_time("during the re-check")
        if late is not None:
            return late
        for name, why in failing.items():
            on_event(RestartEvent("drop", clock(), f"dropping {name}: {why}", {"host": name}))
        dropped = tuple({**blamed, **failing}.items())
        decision = plan_next(without(remaining, failing), num_proc, policy)
        if isinstance(decision, Stop):
            return finish(decision, outcome.exit_code)
        if policy.delay > 0:
            on_event(RestartEvent("wait", clock(), f"restarting in {policy.delay:g} s"))
        wait_started = clock()
        delay = policy.delay if deadline is None else min(policy.delay,
                                                          max(deadline - wait_started, 0.0))
        signum = sleep(delay)
        waited_s = clock() - wait_started
        if signum is not None:
            return finish(Stop("interrupted", f"stopped by {signal_name(signum)} before a restart"),
                          EXIT_SIGNAL_BASE + signum)
        late = out_of_time("before a restart")
        if late is not None:
            return late
        current, num_proc = decision.hosts, decision.num_proc
