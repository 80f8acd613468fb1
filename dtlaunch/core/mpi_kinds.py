"""Which MPI an installation is, classified once: its `--version` banner read into an MpiImpl
(name, version), and MPI_KINDS, the one table of what dtlaunch knows of each MPI (the family
whose launcher starts it, its Horovod wheel slug, its libmpi ABI). Pure; below everything that
judges or starts an MPI, so that reading a host's facts needs nothing else."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

MIN_OMPI = (3, 0)
INSTALL_OMPI_HINT = (
    "install Open MPI: 'apt-get install openmpi-bin libopenmpi-dev' (Debian/Ubuntu) or "
    "'dnf install openmpi openmpi-devel' (RHEL/Fedora), then make sure mpirun is on PATH"
)
INSTALL_MPICH_HINT = (
    "install MPICH ('apt-get install mpich libmpich-dev', or 'pip install mpich' into the venv "
    "the job runs from) or load Intel MPI's environment, then make its mpiexec come first on PATH"
)

# Each implementation's `--version` banner; the version text itself is read by `packaging`.
# Open MPI 4's mpiexec (Debian's too) answers as OpenRTE's, under its own name.
_OMPI_RE = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\S+)")
# Compiled on first use (re's cache), as only another MPI's banner needs them.
_INTEL_RE = r"Version\s+(\S+)"
_HYDRA_RE = r"Version:\s+(\S+)"


OPEN_MPI_FAMILY, HYDRA_FAMILY = "Open MPI", "Hydra"


@dataclass(frozen=True)
class HostNeeds:
    """What every host of a job started this way needs beyond Python and the program, as the
    checks judge it: an MPI (the launcher's), Horovod built with a controller, or neither."""

    mpi: bool = True  # the launcher's MPI, the same on every host
    horovod: str | None = "MPI"  # Horovod built with this controller; None: not needed
    option: str = ""  # the option that chose this way (named where a check is not needed)


@dataclass(frozen=True)
class HostRule:
    """How doctor judges a host's MPI for a job this family launches (dtlaunch.check.mpi_checks
    applies it; the family is never tested there). Texts are formats of: {mpirun} (the host's
    launcher path), {here}, {here_version} (its MPI), {local}, {local_version} (this
    machine's), {least} (the oldest release dtlaunch supports)."""

    family: str
    same: tuple[str, ...]  # what of MpiImpl must equal this machine's ("version"; "name" too)
    passed: str  # the detail of a host that passes
    mismatch: str  # same family, not the same MPI as this machine's
    mismatch_fix: str
    foreign: str  # another family's MPI (one dtlaunch knows) on a host of this family's job
    foreign_fix: str
    unsupported: str  # an MPI this family cannot run, and no family dtlaunch knows
    unsupported_fix: str
    too_old: str
    too_old_fix: str
    unknown: str  # what the host's MPI is called when its banner names none
    # Each host needs this daemon on its PATH; "": the launcher starts its proxy by its own path.
    daemon: str = ""


_SAME_HYDRA_FIX = ("install {local} on this host at this machine's mpiexec path (Hydra starts "
                   "hydra_pmi_proxy from there) and put its bin directory first on PATH")
OPEN_MPI_RULE = HostRule(
    OPEN_MPI_FAMILY, ("version",), passed="{here_version}",
    mismatch="Open MPI {here_version} here, {local_version} on this machine (different "
    "versions fail with 'Data unpack would read past end of buffer')",
    mismatch_fix="install the same Open MPI version on every host and on this machine",
    foreign="{mpirun} is {here}; this machine's mpirun is {local}, whose daemons this host "
    "cannot run",
    foreign_fix="put Open MPI {local_version}'s bin directory first on this host's PATH (a "
    "non-interactive login's), or run the whole job with MPICH: the same MPI must come first on "
    "PATH on every host and on this machine",
    unsupported="{mpirun} is {here}; dtlaunch needs Open MPI >= 3.0",
    unsupported_fix=INSTALL_OMPI_HINT + ", and make its mpirun come first on PATH",
    too_old="{mpirun} is Open MPI {here_version}, older than {least}",
    too_old_fix="an old Open MPI comes first on PATH: remove it or put the newer one's bin "
    "directory first; " + INSTALL_OMPI_HINT,
    unknown="not Open MPI", daemon="orted")
HYDRA_RULE = HostRule(
    HYDRA_FAMILY, ("name", "version"), passed="{here}",
    mismatch="{here} here, {local} on this machine", mismatch_fix=_SAME_HYDRA_FIX,
    foreign="{mpirun} is {here}; this machine's mpiexec is {local}",
    foreign_fix=_SAME_HYDRA_FIX + ", or run the whole job with Open MPI",
    unsupported="{mpirun} is {here}; this machine's mpiexec is {local}",
    unsupported_fix=_SAME_HYDRA_FIX + ", or run the whole job with Open MPI",
    too_old="{mpirun} is {here}; dtlaunch needs >= {least}", too_old_fix=INSTALL_MPICH_HINT,
    unknown="not an MPI")


@dataclass(frozen=True)
class MpiKind:
    """What dtlaunch knows of one MPI implementation beyond its launcher."""

    name: str  # as parse_mpirun_version names it
    rule: HostRule  # its family (whose launcher starts its jobs) and how it judges hosts
    slug: str  # its short name in the names of the Horovod wheels dtlaunch builds
    libmpi_major: str  # the N of the libmpi.so.N its libraries carry (the ABI Horovod links)
    # libmpi.so.N.M: (least M, the release's major version), highest first, where M tells it.
    libmpi_releases: tuple[tuple[int, int], ...] = ()
    install_hint: str = ""  # how to install it (the fix for a host without it)
    min_release: tuple[int, ...] = ()  # the oldest release dtlaunch supports
    # The variable its compiler wrappers read their installation prefix from, set when
    # Horovod is built against it; "" when they need none.
    prefix_variable: str = ""
    info_tool: str = ""  # the program that lists its build's components ("": none read)

    @property
    def family(self) -> str:
        return self.rule.family


# The one classification of an MPI by its name (none: unsupported). A new MPI is a line here
# and, for a new way to start jobs, a family folder.
MPI_KINDS = {kind.name: kind for kind in (
    # libtool's age: 0-10 for 3.x, 20-30 for 4.x, 40 for 5.x.
    MpiKind("Open MPI", OPEN_MPI_RULE, "ompi", "40", ((40, 5), (20, 4), (0, 3)),
            INSTALL_OMPI_HINT, MIN_OMPI, info_tool="ompi_info"),
    MpiKind("MPICH", HYDRA_RULE, "mpich", "12", (), INSTALL_MPICH_HINT, (3, 0)),
    MpiKind("Intel MPI", HYDRA_RULE, "impi", "12", (), INSTALL_MPICH_HINT,
            prefix_variable="I_MPI_ROOT"),
)}
# The MPI a host without a supported one is judged against, and the one dtlaunch suggests.
PREFERRED_MPI = "Open MPI"


def kinds_with_libmpi(major: str) -> tuple[MpiKind, ...]:
    """The MPIs whose libmpi is libmpi.so.`major`: one ABI, possibly several MPIs."""
    return tuple(kind for kind in MPI_KINDS.values() if kind.libmpi_major == major)


@dataclass(frozen=True)
class MpiImpl:
    name: str  # "Open MPI", "MPICH", "Intel MPI", "unknown"
    version: str  # "4.1.4" or "" when unknown

    @property
    def release(self) -> tuple[int, ...]:
        """(4, 1, 4); () when the version is unknown or unreadable."""
        try:
            return Version(self.version).release
        except InvalidVersion:
            return ()

    @property
    def kind(self) -> MpiKind | None:
        """What dtlaunch knows of this MPI; None for one it does not support."""
        return MPI_KINDS.get(self.name)

    def needs_newer(self) -> str | None:
        """The oldest release dtlaunch supports ("3.0") when this one is older; else None
        (also when the version or the MPI is unknown)."""
        least = self.kind.min_release if self.kind else ()
        if self.release and self.release < least:
            return ".".join(map(str, least))
        return None

    @property
    def family(self) -> str | None:
        """OPEN_MPI_FAMILY, HYDRA_FAMILY, or None for an MPI no family starts."""
        return self.kind.family if self.kind else None


def parse_mpirun_version(text: str) -> MpiImpl:
    """Read the `--version` output of any MPI implementation's launcher."""
    match = _OMPI_RE.search(text)
    if match:
        return MpiImpl("Open MPI", match.group(1))
    lowered = text.lower()
    if "intel(r) mpi" in lowered or "intel mpi" in lowered:
        found = re.search(_INTEL_RE, text)
        return MpiImpl("Intel MPI", found.group(1) if found else "")
    found = re.search(_HYDRA_RE, text)
    # "hydra" alone is no banner: Intel MPI's mpirun says "mpiexec.hydra: not found" when
    # mpiexec.hydra is not on PATH.
    if ("hydra" in lowered and found) or "mpich" in lowered:
        return MpiImpl("MPICH", found.group(1) if found else "")
    if "mvapich" in lowered:
        return MpiImpl("MVAPICH", "")
    return MpiImpl("unknown", "")
