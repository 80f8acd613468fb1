"""What every way of starting a job shares: the job's spec, `--iface`, versions, and the
`MpiFamily` interface that each MPI implementation's launcher fills in (dtlaunch.openmpi.family,
dtlaunch.hydra.family). Pure."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from packaging.version import InvalidVersion, Version

from dtlaunch.core.errors import UsageError
from dtlaunch.job.env import EnvPlan
from dtlaunch.job.hosts import Host
from dtlaunch.reach.ssh_options import SshOptions

if TYPE_CHECKING:
    from dtlaunch.core.failure import Failure
    from dtlaunch.core.records import Event

MIN_OMPI = (3, 0)
INSTALL_OMPI_HINT = (
    "install Open MPI: 'apt-get install openmpi-bin libopenmpi-dev' (Debian/Ubuntu) or "
    "'dnf install openmpi openmpi-devel' (RHEL/Fedora), then make sure mpirun is on PATH"
)


@dataclass(frozen=True)
class Interfaces:
    """`--iface`: interface names (eth0,ib0) or CIDR subnets (10.0.0.0/24), not a mix."""

    names: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()

    def mca_value(self) -> str:
        return ",".join(self.names or self.cidrs)


_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
IFACE_FORMAT = "expected interface names (eth0,ib0) or CIDR subnets (10.0.0.0/24)"


def parse_iface(spec: str) -> Interfaces:
    items = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in items):
        raise UsageError(f"--iface: empty entry in {spec!r}; {IFACE_FORMAT}")
    names: list[str] = []
    cidrs: list[str] = []
    for item in items:
        if "/" in item:
            try:
                net = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise UsageError(f"--iface: invalid CIDR {item!r}; {IFACE_FORMAT}") from None
            if net.version != 4:
                raise UsageError(f"--iface: {item!r}: Open MPI's TCP selection takes IPv4 subnets")
            cidrs.append(str(net))
        elif _IFNAME_RE.match(item) and not item.startswith("-"):
            names.append(item)
        else:
            raise UsageError(f"--iface: invalid interface name {item!r}; {IFACE_FORMAT}")
    if names and cidrs:
        raise UsageError("--iface: give either interface names or CIDR subnets, not both")
    return Interfaces(tuple(dict.fromkeys(names)), tuple(dict.fromkeys(cidrs)))


@dataclass(frozen=True)
class JobSpec:
    hosts: tuple[Host, ...]
    num_proc: int
    program: tuple[str, ...]  # interpreter, script or -m module, and its arguments
    env: EnvPlan = field(default_factory=lambda: EnvPlan(()))
    iface: Interfaces | None = None
    ssh: SshOptions = field(default_factory=SshOptions)
    as_root: bool = False
    oversubscribe: bool = False
    tree_spawn: bool = False
    mpi_version: tuple[int, ...] = ()  # the local launcher's release; (): unknown
    mpi_args: tuple[str, ...] = ()
    # Command the launcher uses instead of plain ssh (dtlaunch's link watcher); None: plain ssh.
    rsh_agent: str | None = None
    # Inside a Slurm job: Open MPI's plm slurm starts the daemons with srun (no ssh at all).
    slurm: bool = False
    # --binding-args (checked by dtlaunch.job.binding); None: dtlaunch's default binding.
    binding: tuple[str, ...] | None = None


def split_mpi_args(text: str) -> tuple[str, ...]:
    """`--mpi-args "..."`: split like a POSIX shell would, never run by one."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"--mpi-args: cannot split {text!r}: {exc}") from None


def format_command(argv: Sequence[str], env_prefix: Sequence[tuple[str, str]] = ()) -> str:
    """A shell-quoted line that can be pasted into a shell."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in env_prefix]
    return " ".join(prefix + [shlex.quote(a) for a in argv])


# --- versions ---------------------------------------------------------------------------------

# Each implementation's `--version` banner; the version text itself is read by `packaging`.
# Open MPI 4's mpiexec (Debian's too) answers as OpenRTE's, under its own name.
_OMPI_RE = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\S+)")
_INTEL_RE = re.compile(r"Version\s+(\S+)")
_HYDRA_RE = re.compile(r"Version:\s+(\S+)")


OPEN_MPI_FAMILY, HYDRA_FAMILY = "Open MPI", "Hydra"


@dataclass(frozen=True)
class MpiKind:
    """What dtlaunch knows of one MPI implementation beyond its launcher."""

    name: str  # as parse_mpirun_version names it
    family: str  # the family whose launcher starts its jobs
    slug: str  # its short name in the names of the Horovod wheels dtlaunch builds
    libmpi_major: str  # the N of the libmpi.so.N its libraries carry (the ABI Horovod links)
    # libmpi.so.N.M: (least M, the release's major version), highest first, where M tells it.
    libmpi_releases: tuple[tuple[int, int], ...] = ()
    # The variable its compiler wrappers read their installation prefix from, set when
    # Horovod is built against it; "" when they need none.
    prefix_variable: str = ""


# The one classification of an MPI by its name (none: unsupported). A new MPI is a line here
# and, for a new way to start jobs, a family folder.
MPI_KINDS = {kind.name: kind for kind in (
    # libtool's age: 0-10 for 3.x, 20-30 for 4.x, 40 for 5.x.
    MpiKind("Open MPI", OPEN_MPI_FAMILY, "ompi", "40", ((40, 5), (20, 4), (0, 3))),
    MpiKind("MPICH", HYDRA_FAMILY, "mpich", "12"),
    MpiKind("Intel MPI", HYDRA_FAMILY, "impi", "12", prefix_variable="I_MPI_ROOT"),
)}
MPI_FAMILIES = {name: kind.family for name, kind in MPI_KINDS.items()}


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

    @property
    def family(self) -> str | None:
        """OPEN_MPI_FAMILY, HYDRA_FAMILY, or None for an MPI no family starts."""
        return MPI_FAMILIES.get(self.name)

    @property
    def is_open_mpi(self) -> bool:
        return self.family == OPEN_MPI_FAMILY

    @property
    def is_hydra(self) -> bool:
        return self.family == HYDRA_FAMILY


def parse_mpirun_version(text: str) -> MpiImpl:
    """Read the `--version` output of any MPI implementation's launcher."""
    match = _OMPI_RE.search(text)
    if match:
        return MpiImpl("Open MPI", match.group(1))
    lowered = text.lower()
    if "intel(r) mpi" in lowered or "intel mpi" in lowered:
        found = _INTEL_RE.search(text)
        return MpiImpl("Intel MPI", found.group(1) if found else "")
    found = _HYDRA_RE.search(text)
    # "hydra" alone is no banner: Intel MPI's mpirun says "mpiexec.hydra: not found" when
    # mpiexec.hydra is not on PATH.
    if ("hydra" in lowered and found) or "mpich" in lowered:
        return MpiImpl("MPICH", found.group(1) if found else "")
    if "mvapich" in lowered:
        return MpiImpl("MVAPICH", "")
    return MpiImpl("unknown", "")


# --- the seam: how a job is started -------------------------------------------------------------


class OutputDemux(Protocol):
    """Turns one of the launcher's streams back into what each rank's shim sent
    (dtlaunch.core.records: bytes in, any cut; events out)."""

    def feed(self, data: bytes) -> list[Event]: ...

    def flush(self) -> list[Event]: ...


class MpiFamily(Protocol):
    """One way to start a job (Open MPI's mpirun; Hydra's mpiexec for MPICH and Intel MPI).

    Everything is pure: the argv comes from a JobSpec, and output, failures and versions are
    read from text. Running it is launch.execute's business."""

    name: str  # "Open MPI"
    launcher: str  # the program that starts a job: "mpirun"
    install_hint: str
    # The rank shim's largest record: PIPE_BUF (one atomic write), unless the launcher tags each
    # rank's output so that its pieces can be joined exactly (see dtlaunch.agents.rank_shim).
    record_limit: int
    # True: the launcher ends the job when a rank fails and its report and exit status stand
    # (Open MPI). False: it waits for the other ranks, so dtlaunch ends the job on the failed
    # rank's exit record, the rank's status is the job's, and what the launcher reports about
    # ranks dtlaunch stopped is not the job's fault (Hydra).
    ends_job_on_rank_failure: bool

    def parse_version(self, text: str) -> MpiImpl: ...

    def unsupported(self, impl: MpiImpl, program: str) -> str | None:
        """Why this launcher cannot be used, or None."""
        ...

    def build_argv(self, spec: JobSpec, launcher: str) -> tuple[str, ...]: ...

    def new_demux(self, stream: str, release: tuple[int, ...] = ()) -> OutputDemux:
        """A reader for the launcher's "stdout" or "stderr"."""
        ...

    def parse_failure(self, lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None: ...

    def launcher_env(self, spec: JobSpec) -> dict[str, str]:
        """Variables the launcher's own environment needs for this job (beyond the plan's)."""
        ...

    def launcher_defaults(self, spec: JobSpec) -> dict[str, str]:
        """Variables the launcher needs for this job unless its environment already sets them
        (the user's value wins; they are not shown with the command)."""
        ...

    def refuse_insecure(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> None:
        """Raise UsageError when the user's extra launcher arguments or the launcher's
        environment make its ssh accept any host key."""
        ...

    def ssh_left_to_dtlaunch(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> bool:
        """False when the user's extra launcher arguments or the launcher's environment may
        change how ssh is run."""
        ...

    def support_files(self, spec: JobSpec) -> tuple[tuple[str, str], ...]:
        """Files (path, text) the launcher needs written before it starts (mode 0700)."""
        ...

    def ssh_setting_files(self, launcher: str) -> list[str]:
        """`file: setting` for each setting that changes how `launcher` runs ssh in a file it
        reads by default (the one method here that reads files)."""
        ...

    def job_iface(self, chosen: Interfaces, common_name: str | None) -> Interfaces | None:
        """What the launcher is given for the network dtlaunch chose (`common_name`: that
        network's interface name where every host calls it the same)."""
        ...
