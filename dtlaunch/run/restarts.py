"""`dtlaunch run --max-restarts N`: after a failed attempt, whether the job starts again and on
which hosts. Pure: `decide` looks at how an attempt ended and returns the next attempt or why
there is none; run/restart_loop.py runs the attempts.

The rules, in order:
- success, the user's interrupt (SIGINT/SIGTERM/SIGHUP) and ``--timeout`` end the job; a host
  key ssh refused, a lost allocation and an option the launcher refused would fail again;
- no restarts left, or the same failure twice in a row (a bug, not bad luck), end it early;
- a lost host is dropped; the host of a rank killed by a signal is dropped unless it is the only
  one left (a one-machine job is restarted where it is, and the re-check decides);
- the remaining hosts are re-checked and those that fail are dropped (`without`);
- ``-np`` shrinks to the slots that remain (never grows back); fewer than ``--min-np`` stops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from dtlaunch.core.errors import UsageError
from dtlaunch.core.failure import Failure, signal_name
from dtlaunch.job.hosts import Host, total_slots

RESTART_COUNT_ENV = "DTLAUNCH_RESTART_COUNT"
EXIT_SIGNAL_BASE = 128
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


def host_named(name: str, hosts: Sequence[Host]) -> Host | None:
    """mpirun may name a node by its full name where the host list has the short one."""
    short = name.split(".")[0]
    return next((h for h in hosts if h.name == name), None) \
        or next((h for h in hosts if h.name.split(".")[0] == short), None)


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
