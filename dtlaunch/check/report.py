"""One report model for doctor, the run pre-flight and env-check: statuses, a check result
that carries its fix, and the reports built from them. Pure data."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtlaunch.check.facts import GpuFacts, HostFacts


class _Word(str, Enum):
    """A str that prints as its value, so JSON and comparisons with "pass" keep working."""

    def __str__(self) -> str:  # f-strings too: Enum.__format__ uses an overridden __str__
        return str(self.value)


class Status(_Word):
    """A check's verdict."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


class Role(_Word):
    LOCAL = "this machine"  # the machine running dtlaunch
    HOST = "host"  # a host reached through a Prober


PASS, WARN, FAIL, SKIP = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP
LOCAL, HOST = Role.LOCAL, Role.HOST
_RANK = {SKIP: 0, PASS: 1, WARN: 2, FAIL: 3}

CHECK_NAMES = ("reach", "mpirun", "mpi", "python", "torch", "horovod", "script", "iface",
               "hostname", "pairwise")


@dataclass(frozen=True)
class CheckResult:
    """One verdict: what was checked, how it went, what was found, and how to fix it."""

    name: str
    status: Status
    detail: str
    hint: str = ""  # the fix, for WARN and FAIL


def worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, key=_RANK.__getitem__, default=SKIP)


@dataclass(frozen=True)
class HostOutcome:
    """What one host gave us: facts, or the failed check that stopped us getting them."""

    host: str
    role: Role
    facts: HostFacts | None = None
    problem: CheckResult | None = None
    seconds: float = 0.0
    note: str = ""
    is_rank_host: bool = True
    path: str = ""  # how the host was reached, when not over SSH (e.g. "srun")


@dataclass(frozen=True)
class HostReport:
    host: str
    role: Role
    checks: tuple[CheckResult, ...]
    versions: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0
    note: str = ""
    hostname: str = ""
    gpus: GpuFacts | None = None  # None: the host was not reached
    warnings: tuple[str, ...] = ()  # one line each, beside the checks (a cache not used)

    @property
    def status(self) -> Status:
        return worst(c.status for c in self.checks)

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)


JOB = "all hosts"  # the host column of a check about the whole job (the network)


@dataclass(frozen=True)
class DoctorReport:
    hosts: tuple[HostReport, ...]
    seconds: float = 0.0
    reach: str = "ssh"  # how the hosts were reached: the reach column's heading ("ssh", "srun")
    job: tuple[CheckResult, ...] = ()  # checks of the whole job, e.g. the network it uses

    @property
    def ok(self) -> bool:
        return all(h.status != FAIL for h in self.hosts) and all(c.status != FAIL for c in self.job)

    @property
    def status(self) -> Status:
        return worst([*(h.status for h in self.hosts), *(c.status for c in self.job)])

    def label(self, check: str) -> str:
        """A check's name as the user reads it: the reach check by how hosts were reached."""
        return self.reach if check == "reach" else check

    def failures(self, status: Status = FAIL) -> tuple[tuple[str, CheckResult], ...]:
        """(host, check) of every check with `status`; checks of the whole job under JOB."""
        return (*((h.host, c) for h in self.hosts for c in h.checks if c.status == status),
                *((JOB, c) for c in self.job if c.status == status))

    def warning_lines(self, said: str | None = None, shown: int = 8) -> list[str]:
        """The hosts' own warnings (HostReport.warnings), one line per distinct text (a shared
        home gives every host the same one); one holding `said` (already said) is left out."""
        by_text: dict[str, list[str]] = {}
        for host in self.hosts:
            for text in host.warnings:
                if said is None or said not in text:
                    by_text.setdefault(text, []).append(host.host)
        lines = []
        for text, names in by_text.items():
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            lines.append(f"{', '.join(names[:shown])}{more}: {text}")
        return lines


def unreachable(detail: str, hint: str) -> CheckResult:
    """The reach check (ssh, or srun) of a host that could not be probed."""
    return CheckResult("reach", FAIL, detail, hint)
