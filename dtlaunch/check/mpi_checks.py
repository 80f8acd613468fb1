"""The doctor's MPI check for every family: the same implementation and version as the
launcher's, each host's named, and the fix when one host has another MPI. Pure."""

from __future__ import annotations

from dtlaunch.check.facts import HostFacts
from dtlaunch.check.report import FAIL, PASS, SKIP, CheckResult
from dtlaunch.core.mpi_kinds import INSTALL_OMPI_HINT, MIN_OMPI, MpiImpl

NAME = "mpi"  # the report's column for the MPI implementation


def _named(impl: MpiImpl) -> str:
    return f"{impl.name} {impl.version}".strip()


def uses_hydra(launcher: MpiImpl | None) -> bool:
    return launcher is not None and launcher.is_hydra


def check_mpi(facts: HostFacts, launcher: MpiImpl | None) -> CheckResult:
    """`launcher`: the MPI on the launcher (None: judge this machine alone, as env-check does)."""
    impl = facts.mpi
    if impl is None:
        return CheckResult(NAME, SKIP, "no mpirun")
    if uses_hydra(launcher):
        assert launcher is not None
        return _against_hydra(facts, impl, launcher)
    if impl.is_hydra:
        if launcher is None:  # this machine alone: Hydra's MPIs are supported too
            return _alone(facts, impl)
        if launcher.is_open_mpi:
            return CheckResult(
                NAME, FAIL, f"{facts.mpirun} is {_named(impl)}; the launcher's mpirun is "
                f"{_named(launcher)}, whose daemons this host cannot run",
                f"put Open MPI {launcher.version}'s bin directory first on this host's PATH (a "
                "non-interactive login's), or run the whole job with MPICH: the same MPI must "
                "come first on PATH on every host and on the launcher")
    ompi_version = None
    if launcher is not None and launcher.is_open_mpi and launcher.release >= MIN_OMPI:
        ompi_version = launcher.version
    return check_open_mpi(facts, ompi_version)


def _alone(facts: HostFacts, impl: MpiImpl) -> CheckResult:
    """An MPI judged on its own (env-check): one dtlaunch supports, recent enough."""
    kind = impl.kind
    if kind is None:
        return CheckResult(NAME, FAIL, f"{facts.mpirun} is {impl.name}, not an MPI dtlaunch "
                           "starts (Open MPI, MPICH, Intel MPI)", INSTALL_OMPI_HINT)
    least = impl.needs_newer()
    if least is not None:
        return CheckResult(NAME, FAIL, f"{facts.mpirun} is {_named(impl)}; dtlaunch needs "
                           f">= {least}", kind.install_hint)
    return CheckResult(NAME, PASS, _named(impl))


def _against_hydra(facts: HostFacts, impl: MpiImpl, launcher: MpiImpl) -> CheckResult:
    same_fix = (f"install {_named(launcher)} on this host at the launcher's path (Hydra starts "
                "hydra_pmi_proxy from there) and put its bin directory first on PATH")
    if not impl.is_hydra:
        return CheckResult(NAME, FAIL, f"{facts.mpirun} is {_named(impl) or 'not an MPI'}; the "
                           f"launcher's mpiexec is {_named(launcher)}", same_fix
                           + ", or run the whole job with Open MPI")
    if (impl.name, impl.version) != (launcher.name, launcher.version):
        return CheckResult(NAME, FAIL, f"{_named(impl)} here, {_named(launcher)} on the launcher",
                           same_fix)
    return CheckResult(NAME, PASS, _named(impl))


def check_open_mpi(facts: HostFacts, launcher_version: str | None) -> CheckResult:
    impl = facts.mpi
    if impl is None:
        return CheckResult(NAME, SKIP, "no mpirun")
    if not impl.is_open_mpi:
        name = impl.name if impl.name != "unknown" else "not Open MPI"
        return CheckResult(NAME, FAIL, f"{facts.mpirun} is {name}"
                           + (f" {impl.version}" if impl.version else "")
                           + "; dtlaunch needs Open MPI >= 3.0",
                           INSTALL_OMPI_HINT + ", and make its mpirun come first on PATH")
    if impl.release < MIN_OMPI:
        return CheckResult(NAME, FAIL,
                           f"{facts.mpirun} is Open MPI {impl.version}, older than 3.0",
                           "an old Open MPI comes first on PATH: remove it or put the newer one's "
                           "bin directory first; " + INSTALL_OMPI_HINT)
    if launcher_version and impl.version != launcher_version:
        return CheckResult(NAME, FAIL,
                           f"Open MPI {impl.version} here, {launcher_version} on the launcher "
                           "(different versions fail with 'Data unpack would read past end of "
                           "buffer')", "install the same Open MPI version on every host and on "
                           "the launcher")
    return CheckResult(NAME, PASS, impl.version)
