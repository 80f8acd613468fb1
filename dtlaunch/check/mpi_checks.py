"""The doctor's MPI check for every family: the same implementation and version as this
machine's, each host's named, and the fix when one host has another MPI. The judging is one
procedure; what differs between families (what must match, the texts, the fixes) is data on
their HostRule (dtlaunch.core.mpi_kinds), so no family is named here. Also whether Horovod
loads the job's MPI (check_horovod_mpi). Pure."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from dtlaunch.check.facts import HostFacts, PythonFacts
from dtlaunch.check.report import FAIL, PASS, SKIP, CheckResult
from dtlaunch.core.mpi_kinds import MPI_KINDS, PREFERRED_MPI, MpiImpl, kinds_with_libmpi

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


# --- does Horovod on a host load the MPI the job runs with? ------------------------------------
# Horovod links one MPI library at build time. Started by another MPI's launcher it fails in
# `hvd.init()` or hangs (Open MPI's libmpi under MPICH's Hydra, or Open MPI 4's libmpi under
# Open MPI 5's prterun), an error that names neither MPI. The probe records the libmpi file that
# `import horovod.torch` loaded; its name carries the ABI: libmpi.so.12 for the MPICH family
# (MPICH, Intel MPI), libmpi.so.40.N for Open MPI 3.0 and later, where libtool's N is 0-10 for
# 3.x, 20-30 for 4.x and 40 for 5.x.

_SONAME = re.compile(r"libmpi\.so\.(\d+)(?:\.(\d+))?(?:\.\d+)*")


@dataclass(frozen=True)
class LoadedMpi:
    """The MPI a libmpi file belongs to, as far as its name tells."""

    names: tuple[str, ...]  # the MPIs with that ABI ("MPICH", "Intel MPI")
    release: int | None = None  # the major version, where the name tells it

    def describe(self) -> str:
        if len(self.names) == 1:
            return f"{self.names[0]} {self.release}" if self.release else self.names[0]
        return " or ".join([", ".join(self.names[:-1]), self.names[-1]])


def library_mpi(path: str) -> LoadedMpi | None:
    """The MPI of a libmpi file, from its name (mpi.MPI_KINDS); None: unknown."""
    match = _SONAME.fullmatch(posixpath.basename(path))
    if match is None:
        return None
    kinds = kinds_with_libmpi(match.group(1))
    if not kinds:
        return None
    release = None
    if len(kinds) == 1 and match.group(2):
        minor = int(match.group(2))
        release = next((major for least, major in kinds[0].libmpi_releases if minor >= least), None)
    return LoadedMpi(tuple(k.name for k in kinds), release)


def _matches(lib: LoadedMpi, mpi: MpiImpl) -> bool:
    if mpi.kind is None:
        return True  # an MPI this module cannot judge
    return mpi.name in lib.names and (lib.release is None or not mpi.release
                                      or lib.release == mpi.release[0])


def check_horovod_mpi(result: CheckResult, py: PythonFacts, mpi: MpiImpl | None,
                      mpirun: str) -> CheckResult:
    """The host's horovod check, failed when Horovod loads another MPI than `mpi`, the one
    whose launcher (`mpirun`) starts the job there."""
    if result.status != PASS or not py.horovod_mpi_lib or mpi is None:
        return result
    lib = library_mpi(py.horovod_mpi_lib)
    if lib is None or _matches(lib, mpi):
        return result
    loaded = lib.describe()
    runs = f"{mpi.name} {mpi.version}".strip()
    return CheckResult(
        "horovod", FAIL,
        f"horovod loads {loaded} ({py.horovod_mpi_lib}), but the job runs {runs} ({mpirun})",
        f"build Horovod against the job's MPI, with its bin directory first on PATH: "
        f"dtlaunch install-horovod --mpi {mpirun or 'PATH/TO/mpirun'}")
