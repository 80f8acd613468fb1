"""How a job ended, as one value: the root cause first (the first failure in time, with its
rank's last lines), then every other failure grouped by cause and host range, never a line per
rank. Pure: built from the LaunchResult, rendered by the CLI (console/render.py) as text or JSON.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dtlaunch.core.failure import Failure, signal_name

TAIL_BYTES = 4096  # per rank: what is kept of its latest output, for the report
TAIL_LINES = 10  # shown of it
LINE_CHARS = 300  # each cut to this
HOSTS_SHOWN = 12  # host names or ranges in a group's line before "and N more"


@dataclass(frozen=True)
class RankEnd:
    """What the exit records told of one rank."""

    rank: int
    host: str
    how: str | None  # "exit 3", "signal 15"; None: no exit record came
    at: float | None = None  # when its program ended (its host's clock)
    order: int = 0  # the order its record came in (a tie-break, and the order without times)

    @property
    def failed(self) -> bool:
        return self.how != "exit 0"

    def failure(self) -> Failure:
        code, sig = split_how(self.how)
        return Failure(self.rank, self.host or None, exit_code=code, signal=sig)


@dataclass(frozen=True)
class JobRanks:
    """The ranks of a job as its output told them: rank -> host, their ends, and the last
    lines of each rank that failed."""

    hosts: tuple[str, ...] = ()
    ends: tuple[RankEnd, ...] = ()
    tails: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    reported: bool = False  # any rank's record came at all (a job that never started: no)


@dataclass(frozen=True)
class RootCause:
    failure: Failure
    at: float | None = None  # when its rank's program ended (its host's clock)
    last_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class FailureGroup:
    cause: str  # "SIGTERM after rank 3 failed"
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    exit_code: int | None = None
    signal: int | None = None

    @property
    def ranks_text(self) -> str:
        return number_ranges(self.ranks)

    @property
    def hosts_text(self) -> str:
        return host_ranges(self.hosts)

    def line(self) -> str:
        word = "rank" if len(self.ranks) == 1 else "ranks"
        return f"{word} {self.ranks_text} on {self.hosts_text}: {self.cause}"


@dataclass(frozen=True)
class JobReport:
    exit_code: int
    status: str  # "ok", "failed", "stopped" (a signal), "timed-out"
    ranks: int = 0
    root: RootCause | None = None
    others: tuple[FailureGroup, ...] = ()
    notes: tuple[str, ...] = ()  # "stopped by SIGINT; ..." and the like, before the failure
    quiet: bool = False  # dtlaunch's reader went away (SIGPIPE): nothing to say

    def summary(self) -> str | None:
        """The one line that ends the report (the line a script reads), as before."""
        return f"job failed: {self.root.failure.describe()}" if self.root is not None else None


# --- building it ------------------------------------------------------------------------------


def split_how(how: str | None) -> tuple[int | None, int | None]:
    """(exit code, signal) of "exit 3" / "signal 9"."""
    if how is None:
        return None, None
    kind, _, number = how.partition(" ")
    if not number.lstrip("-").isdigit():
        return None, None
    return (None, int(number)) if kind == "signal" else (int(number), None)


def first_in_time(ends: Sequence[RankEnd]) -> RankEnd | None:
    """The failed rank whose program ended first; the record's order where times are
    missing or equal."""
    failed = [e for e in ends if e.how is not None and e.failed and split_how(e.how) != (None, None)]
    if not failed:
        return None
    timed = [e for e in failed if e.at is not None]
    pool = timed or failed
    return min(pool, key=lambda e: (e.at or 0.0, e.order))


def _root(failure: Failure, ranks: JobRanks) -> RootCause:
    ends = {e.rank: e for e in ranks.ends}
    first = first_in_time(ranks.ends)
    mine = ends.get(failure.rank) if failure.rank is not None else None
    # The launcher names the failure it noticed; the ranks' own records say which came first.
    # A plain exit or signal of no rank, or of a rank that ended later, gives way to the first.
    if first is not None and not failure.reason and (failure.rank is None or (
            first.rank != failure.rank and mine is not None and mine.at is not None
            and first.at is not None and first.at < mine.at)):
        failure, mine = first.failure(), first
    tail = ranks.tails.get(failure.rank, ()) if failure.rank is not None else ()
    return RootCause(failure, mine.at if mine else None, tail)


def group_failures(ends: Sequence[RankEnd], hosts: Sequence[str], after: str = "",
                   skip: int | None = None) -> tuple[FailureGroup, ...]:
    """The failed ranks (all but `skip`), one group per cause, in rank order of first rank."""
    by_cause: dict[str | None, list[RankEnd]] = {}
    for end in sorted(ends, key=lambda e: e.rank):
        if end.rank == skip or not end.failed:
            continue
        by_cause.setdefault(end.how, []).append(end)
    groups = []
    for how, members in by_cause.items():
        code, sig = split_how(how)
        cause = (signal_name(sig) if sig is not None else f"exit code {code}" if code is not None
                 else "no exit record (ended with the job)")
        names = tuple(dict.fromkeys(e.host or (hosts[e.rank] if e.rank < len(hosts) else "?")
                                    for e in members))
        groups.append(FailureGroup(cause + after, tuple(e.rank for e in members), names, code,
                                   sig))
    return tuple(groups)


def build_report(exit_code: int, failure: Failure | None, ranks: JobRanks, *,
                 interrupted_by: int | None = None, timed_out: bool = False,
                 timeout: float | None = None) -> JobReport:
    """The job's report from what execute saw: the failure it settled on, and the ranks."""
    if interrupted_by == signal.SIGPIPE:
        return JobReport(exit_code, "stopped", len(ranks.hosts), quiet=True)
    notes: list[str] = []
    status = "ok" if exit_code == 0 else "failed"
    if interrupted_by is not None:
        notes.append(f"stopped by {signal_name(interrupted_by)}; all ranks were told to exit")
        status = "stopped"
    elif timed_out:
        notes.append(f"job stopped: it ran longer than --timeout {timeout or 0:g} s")
        status = "timed-out"
    if failure is None or exit_code == 0:
        return JobReport(exit_code, status, len(ranks.hosts), notes=tuple(notes))
    root = _root(failure, ranks)
    rank, host = root.failure.rank, root.failure.host
    if rank is not None:
        after = f" after rank {rank} failed"
    elif host is not None:
        after = f" after host {host} failed"
    else:
        after = ""
    others = group_failures(ranks.ends, ranks.hosts, after, rank) if ranks.reported else ()
    return JobReport(exit_code, status, len(ranks.hosts), root, others, tuple(notes))


# --- ranges -------------------------------------------------------------------------------


def number_ranges(numbers: Sequence[int]) -> str:
    """0,1,2,5,7,8 -> `0-2,5,7-8`."""
    runs: list[list[int]] = []
    for number in sorted(set(numbers)):
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


_NUMBERED = r"(.*?)(\d+)(\D*)"  # compiled on first use (re's cache): a failed job's report


def host_ranges(hosts: Sequence[str], shown: int = HOSTS_SHOWN) -> str:
    """h2,h3,...,h16 -> `h2-h16`; node001..node004 -> `node001-node004`. Names are kept in
    their first order; runs of consecutive numbers with the same prefix, suffix and width
    join; more than `shown` pieces end in "and N more"."""
    pieces: list[list[str]] = []  # each: the names of one run
    last_key: tuple[str, str, int] | None = None
    last_number = -2
    for name in dict.fromkeys(hosts):
        match = re.fullmatch(_NUMBERED, name)
        if match is None:
            pieces.append([name])
            last_key = None
            continue
        prefix, digits, suffix = match.groups()
        width = len(digits) if digits.startswith("0") else 0
        key = (prefix, suffix, width)
        number = int(digits)
        if key == last_key and number == last_number + 1:
            pieces[-1].append(name)
        else:
            pieces.append([name])
        last_key, last_number = key, number
    texts = [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in pieces]
    if len(texts) > shown:
        return ",".join(texts[:shown]) + f" and {len(texts) - shown} more"
    return ",".join(texts)


def tail_lines(data: bytes) -> tuple[str, ...]:
    """The last lines of a rank's kept output, as text: a redrawn line (`\\r`) as last drawn."""
    text = data.decode("utf-8", "replace")
    lines = [line.rsplit("\r", 1)[-1] if "\r" in line else line
             for line in text.replace("\r\n", "\n").split("\n")]
    if len(data) >= TAIL_BYTES and lines:
        lines = lines[1:]  # the first is cut: it started before what was kept
    lines = [line for line in lines if line.strip()]
    return tuple(line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "..."
                 for line in lines[-TAIL_LINES:])
