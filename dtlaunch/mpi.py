"""Build the mpirun command line (pure) and read Open MPI's version output."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from dtlaunch.envvars import EnvPlan
from dtlaunch.errors import UsageError
from dtlaunch.hosts import Host, format_hosts

MIN_OMPI = (3, 0)
DEFAULT_OMPI_MAJOR = 4
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
class SshOptions:
    port: int | None = None
    identity_file: str | None = None
    config_file: str | None = None
    connect_timeout: int = 10
    # "yes": unknown keys fail; "accept-new": trust on first use (opt-in). Never "no".
    host_key_policy: str = "yes"

    def ssh_args(self) -> tuple[str, ...]:
        """Options for OpenSSH as mpirun will call it: never prompt, never hang."""
        args: list[str] = [
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={self.connect_timeout}",
            "-o", f"StrictHostKeyChecking={self.host_key_policy}",
            # A dead host during a job ends the ssh link, so mpirun notices and aborts.
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
        ]  # fmt: skip
        if self.port is not None:
            args += ["-p", str(self.port)]
        if self.identity_file:
            args += ["-i", self.identity_file]
        if self.config_file:
            args += ["-F", self.config_file]
        return tuple(args)


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
    ompi_major: int = DEFAULT_OMPI_MAJOR
    mpi_args: tuple[str, ...] = ()
    # Command mpirun uses instead of plain ssh (dtlaunch's link watcher); None: plain ssh.
    rsh_agent: str | None = None


def btl_for(ompi_major: int) -> str:
    """Point-to-point transports: shared memory within a host, TCP between hosts.

    The shared-memory BTL is `vader` in Open MPI 3 and 4 and `sm` in 5; naming it explicitly
    (instead of horovodrun's `^openib`) keeps same-host ranks off TCP and never picks up
    InfiniBand verbs or UCX paths that hang on hosts without them.
    """
    return "self,sm,tcp" if ompi_major >= 5 else "self,vader,tcp"


def build_mpirun_argv(spec: JobSpec, mpirun: str = "mpirun") -> tuple[str, ...]:
    """The whole mpirun command line, as an argv tuple (never a shell string)."""
    argv: list[str] = [mpirun]
    if spec.as_root:
        argv.append("--allow-run-as-root")
    argv += ["--tag-output", "-np", str(spec.num_proc), "-H", format_hosts(spec.hosts)]
    argv += ["-bind-to", "none", "-map-by", "slot"]
    if spec.oversubscribe:
        argv.append("--oversubscribe")
    argv += ["-mca", "pml", "ob1", "-mca", "btl", btl_for(spec.ompi_major)]
    if spec.iface is not None:
        value = spec.iface.mca_value()
        argv += ["-mca", "btl_tcp_if_include", value, "-mca", "oob_tcp_if_include", value]
    agent = spec.rsh_agent if spec.rsh_agent and not spec.tree_spawn else "ssh"
    # Keep each host's daemon attached to its ssh session (Open MPI detaches it by default):
    # a dead host or sshd then ends that session, which dtlaunch notices, and the daemons'
    # own error messages reach the user.
    argv.append("--leave-session-attached")
    argv += ["-mca", "plm_rsh_agent", agent, "-mca", "plm_rsh_args", " ".join(spec.ssh.ssh_args())]
    if not spec.tree_spawn:
        # Only launcher-to-host SSH is needed (and checked by doctor); tree spawn would also
        # need every host to reach every other host over SSH.
        argv += ["-mca", "plm_rsh_no_tree_spawn", "1"]
    for var in spec.env.variables:
        argv += ["-x", f"{var.name}={var.value}" if var.inline else var.name]
    argv += spec.mpi_args
    argv += spec.program
    return tuple(argv)


def check_rsh_arg(value: str, option: str) -> str:
    """Open MPI splits plm_rsh_args on whitespace, so a path with a space cannot be passed."""
    if any(c.isspace() for c in value):
        raise UsageError(f"{option}: {value!r} contains whitespace, which mpirun's ssh options cannot carry")
    return value


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

_OMPI_RE = re.compile(r"\(Open MPI\)\s+(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class MpiImpl:
    name: str  # "Open MPI", "MPICH", "Intel MPI", "unknown"
    version: str  # "4.1.4" or "" when unknown

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", self.version)[:3])

    @property
    def is_open_mpi(self) -> bool:
        return self.name == "Open MPI"


def parse_mpirun_version(text: str) -> MpiImpl:
    """Read `mpirun --version` output of any MPI implementation."""
    match = _OMPI_RE.search(text)
    if match:
        return MpiImpl("Open MPI", ".".join(p for p in match.groups() if p is not None))
    lowered = text.lower()
    if "intel(r) mpi" in lowered or "intel mpi" in lowered:
        found = re.search(r"Version\s+(\S+)", text)
        return MpiImpl("Intel MPI", found.group(1) if found else "")
    if "hydra" in lowered or "mpich" in lowered:
        found = re.search(r"Version:\s+(\S+)", text)
        return MpiImpl("MPICH", found.group(1) if found else "")
    if "mvapich" in lowered:
        return MpiImpl("MVAPICH", "")
    return MpiImpl("unknown", "")
