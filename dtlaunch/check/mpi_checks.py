"""The doctor's MPI check for every family: the same implementation and version as this
machine's, each host's named, and the fix when one host has another MPI. The judging is one
procedure; what differs between families (what must match, the texts, the fixes) is data on
their HostRule (dtlaunch.core.mpi_kinds), so no family is named here. Pure."""

from __future__ import annotations

from dtlaunch.check.facts import HostFacts
from dtlaunch.check.report import FAIL, PASS, SKIP, CheckResult
from dtlaunch.core.mpi_kinds import MPI_KINDS, PREFERRED_MPI, MpiImpl

NAME = "mpi"  # the report's column for the MPI implementation


def _named(impl: MpiImpl, unknown: str = "unknown") -> str:
    name = impl.name if impl.name != "unknown" else unknown
    return f"{name} {impl.version}".strip()


def host_daemon(local: MpiImpl | None) -> str:
    """The daemon each host must have on its PATH ("": none) for a job started by this
    machine's MPI, `local`."""
    kind = local.kind if local is not None else None
    return (kind.rule if kind else MPI_KINDS[PREFERRED_MPI].rule).daemon


def _too_old(impl: MpiImpl) -> str | None:
    """The oldest supported release when `impl` is older, or its version is unreadable."""
    least = impl.kind.min_release if impl.kind else ()
    if least and impl.version and impl.release < least:
        return ".".join(map(str, least))
    return None


def check_mpi(facts: HostFacts, local: MpiImpl | None) -> CheckResult:
    """`local`: the MPI on this machine (None, or one dtlaunch does not know: judge this
    machine alone, as env-check does)."""
    impl = facts.mpi
    if impl is None:
        return CheckResult(NAME, SKIP, "no mpirun")
    kind = local.kind if local is not None else None
    against = local if kind is not None else None
    # Alone: by its own family's rule when dtlaunch knows it.
    rule = kind.rule if kind else impl.kind.rule if impl.kind else MPI_KINDS[PREFERRED_MPI].rule
    least = _too_old(impl)
    texts = {"mpirun": facts.mpirun, "here": _named(impl, rule.unknown),
             "here_version": impl.version, "least": least or "",
             "local": _named(against) if against else "",
             "local_version": against.version if against else ""}

    def fail(detail: str, fix: str) -> CheckResult:
        return CheckResult(NAME, FAIL, detail.format(**texts), fix.format(**texts))

    if impl.family != rule.family:
        if impl.kind is not None and against is not None:
            return fail(rule.foreign, rule.foreign_fix)
        return fail(rule.unsupported, rule.unsupported_fix)
    if least is not None:
        return fail(rule.too_old, rule.too_old_fix)
    if against is not None and any(
            getattr(impl, field) != getattr(against, field) for field in rule.same):
        return fail(rule.mismatch, rule.mismatch_fix)
    return CheckResult(NAME, PASS, rule.passed.format(**texts))
