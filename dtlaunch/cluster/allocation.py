"""The scheduler allocation dtlaunch runs inside (Slurm, PBS/Torque or LSF), and the request's
hosts and -np there (`plan_allocation`). Pure code.

Everything is parsed from an environment mapping plus the text of the files it names; the
only I/O is `read_allocation_file`, which `detect` uses unless given another reader. Hostlist
syntax (`node[01-04,07]`) is expanded by python-hostlist, the library Slurm sites use.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import hostlist

from dtlaunch.core.errors import UsageError
from dtlaunch.core.textfile import read_small_text
from dtlaunch.job.hosts import Host, format_hosts, parse_host_entry
from dtlaunch.plan.plan import RunRequest

SLURM, PBS, LSF = "Slurm", "PBS", "LSF"

# Nodefiles list one line per slot: big clusters give large but not unbounded files.
MAX_ALLOCATION_FILE_BYTES = 16 << 20


@dataclass(frozen=True)
class Allocation:
    """Hosts and slots a scheduler gave this job (slots = tasks the scheduler planned)."""

    scheduler: str
    job_id: str
    hosts: tuple[Host, ...]
    total_tasks: int
    cpus_per_task: int = 1
    # LSF's launch node when it was left out of `hosts` (see parse_lsf).
    launch_node: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    def describe(self) -> str:
        job = f"{self.scheduler} job {self.job_id}" if self.job_id else f"{self.scheduler} job"
        text = f"hosts from {job}: {format_hosts(self.hosts)}"
        if self.launch_node:
            text += f" (launch node {self.launch_node} left out)"
        return text


def _positive_int(text: str, where: str, what: str = "a whole number of at least 1") -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise UsageError(f"{where}: expected {what}, got {text!r}")
    return int(text)


def _check_node_names(names: Iterable[str], where: str) -> tuple[str, ...]:
    checked = []
    for name in names:
        if ":" in name or not name.strip():
            raise UsageError(f"{where}: invalid host name {name!r}")
        checked.append(parse_host_entry(name, where).name)
    return tuple(checked)


# --- Slurm ------------------------------------------------------------------------------------

def parse_slurm_nodelist(text: str, where: str = "SLURM_JOB_NODELIST") -> tuple[str, ...]:
    """`node[01-04,07],gpu-a[1-2]` -> node names, in Slurm's order (tasks follow it)."""
    if not text.strip():
        raise UsageError(f"{where}: empty node list")
    try:
        names = hostlist.expand_hostlist(text, allow_duplicates=True, sort=False)
    except hostlist.BadHostlist as exc:
        raise UsageError(f"{where}: malformed node list {text!r} ({exc})") from None
    if not names:
        raise UsageError(f"{where}: empty node list")
    names = _check_node_names(names, where)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"{where}: node {dup!r} is listed more than once")
    return names


def parse_slurm_tasks_per_node(text: str, where: str = "SLURM_TASKS_PER_NODE") -> tuple[int, ...]:
    """`2(x3),1` -> (2, 2, 2, 1)."""
    try:
        counts = hostlist.parse_slurm_tasks_per_node(text.strip())
    except hostlist.BadHostlist:
        raise UsageError(f"{where}: malformed task counts {text!r}; expected e.g. 2(x3),1") from None
    # The library accepts `2(x0)` (no nodes) and `0`; neither describes a usable allocation.
    if not counts or re.search(r"\(x0+\)", text) or any(c < 1 for c in counts):
        raise UsageError(f"{where}: every node needs at least 1 task, got {text!r}")
    return tuple(counts)


def parse_slurm(environ: Mapping[str, str]) -> Allocation:
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID", "")
    if not re.fullmatch(r"[0-9]+", job_id):
        raise UsageError(f"SLURM_JOB_ID: expected a job number, got {job_id!r}")
    var = "SLURM_JOB_NODELIST" if "SLURM_JOB_NODELIST" in environ else "SLURM_NODELIST"
    if var not in environ:
        raise UsageError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not; "
                         "is this really inside a Slurm job?")
    nodes = parse_slurm_nodelist(environ[var], var)
    cpus_per_task = 1
    if "SLURM_CPUS_PER_TASK" in environ:
        cpus_per_task = _positive_int(environ["SLURM_CPUS_PER_TASK"], "SLURM_CPUS_PER_TASK")
    if "SLURM_TASKS_PER_NODE" in environ:
        var = "SLURM_TASKS_PER_NODE"
        counts = parse_slurm_tasks_per_node(environ[var], var)
    elif "SLURM_JOB_CPUS_PER_NODE" in environ:
        # No task count was asked for: one task per cpus_per_task CPUs, as Open MPI counts.
        var = "SLURM_JOB_CPUS_PER_NODE"
        cpus = parse_slurm_tasks_per_node(environ[var], var)
        counts = tuple(max(1, c // cpus_per_task) for c in cpus)
    else:
        counts = (1,) * len(nodes)
    if len(counts) != len(nodes):
        raise UsageError(f"{var}: gives {len(counts)} task counts for the {len(nodes)} nodes "
                         f"of SLURM_JOB_NODELIST")
    # No task count at all: 1 per node stands in, or one per GPU once the pre-flight saw them.
    given = var in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE")
    hosts = tuple(Host(n, c, slots_given=given) for n, c in zip(nodes, counts))
    total = sum(counts)
    if "SLURM_NTASKS" in environ:
        ntasks = _positive_int(environ["SLURM_NTASKS"], "SLURM_NTASKS")
        if ntasks > total:
            raise UsageError(f"SLURM_NTASKS: {ntasks} tasks but the nodes have {total} task slots")
        total = ntasks
    return Allocation(SLURM, job_id, hosts, total, cpus_per_task)


# --- PBS / Torque and LSF ---------------------------------------------------------------------

def parse_nodefile(text: str, where: str) -> tuple[Host, ...]:
    """PBS_NODEFILE / LSB_DJOB_HOSTFILE: one host name per line per slot."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if len(line.split()) > 1:
            raise UsageError(f"{where}:{lineno}: expected one host name per line, got {line!r}")
    names = text.split()
    if not names:
        raise UsageError(f"{where}: no hosts in the file")
    # One name per slot -> hosts in order of first appearance.
    return tuple(Host(n, s) for n, s in Counter(_check_node_names(names, where)).items())


def parse_lsb_mcpu_hosts(text: str) -> tuple[Host, ...]:
    """`hostA 2 hostB 4` -> hosts with slots."""
    where = "LSB_MCPU_HOSTS"
    fields = text.split()
    if not fields or len(fields) % 2:
        raise UsageError(f"{where}: expected pairs of host and slots, e.g. 'hostA 2 hostB 4', "
                         f"got {text!r}")
    names = _check_node_names(fields[0::2], where)
    slots = [_positive_int(s, where, "slots of at least 1") for s in fields[1::2]]
    if len(set(names)) != len(names):
        raise UsageError(f"{where}: a host is listed more than once in {text!r}")
    return tuple(Host(n, s) for n, s in zip(names, slots))


def parse_lsf(environ: Mapping[str, str], hostfile_text: str | None) -> Allocation:
    """LSF from LSB_DJOB_HOSTFILE (its text given) or else LSB_MCPU_HOSTS.

    LSF lists the node the job script runs on first. On systems with separate launch nodes
    (IBM's CSM set-up, e.g. Summit) that node holds a single slot and runs no ranks while the
    compute nodes hold many: such a first host is left out and named in `launch_node`.
    """
    if hostfile_text is not None:
        hosts = parse_nodefile(hostfile_text, environ.get("LSB_DJOB_HOSTFILE", "LSB_DJOB_HOSTFILE"))
    elif "LSB_MCPU_HOSTS" in environ:
        hosts = parse_lsb_mcpu_hosts(environ["LSB_MCPU_HOSTS"])
    else:
        raise UsageError("LSB_JOBID is set but neither LSB_DJOB_HOSTFILE nor LSB_MCPU_HOSTS is; "
                         "is this really inside an LSF job?")
    launch = None
    if len(hosts) > 1 and hosts[0].slots == 1 and all(h.slots > 1 for h in hosts[1:]):
        launch, hosts = hosts[0].name, hosts[1:]
    return Allocation(LSF, environ.get("LSB_JOBID", ""), hosts, sum(h.slots for h in hosts),
                      launch_node=launch)


# --- detection (the edge) ---------------------------------------------------------------------

def read_allocation_file(path: str, var: str) -> str:
    """Read a file named by the scheduler's environment; failures are UsageErrors naming both."""
    return read_small_text(path, var, MAX_ALLOCATION_FILE_BYTES, "a node file")


def detect(environ: Mapping[str, str],
           read: Callable[[str, str], str] = read_allocation_file) -> Allocation | None:
    """The allocation this process runs in, or None outside any scheduler job.

    Slurm wins over PBS over LSF when several are set (a Slurm job inside an LSF one is the
    innermost and the one that gave out these nodes).
    """
    if "SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ:
        return parse_slurm(environ)
    if "PBS_NODEFILE" in environ:
        nodefile = environ["PBS_NODEFILE"]
        hosts = parse_nodefile(read(nodefile, "PBS_NODEFILE"), nodefile)
        return Allocation(PBS, environ.get("PBS_JOBID", ""), hosts, sum(h.slots for h in hosts))
    if "PBS_JOBID" in environ:
        raise UsageError("PBS_JOBID is set but PBS_NODEFILE is not; "
                         "is this really inside a PBS job?")
    if "LSB_JOBID" in environ or "LSB_DJOB_HOSTFILE" in environ or "LSB_MCPU_HOSTS" in environ:
        path = environ.get("LSB_DJOB_HOSTFILE")
        text = read(path, "LSB_DJOB_HOSTFILE") if path else None
        return parse_lsf(environ, text)
    return None


# --- checks ------------------------------------------------------------------------------------

def _short(name: str) -> str:
    return name if re.fullmatch(r"[0-9.]+", name) else name.split(".", 1)[0]


def check_hosts_in_allocation(hosts: Sequence[Host], alloc: Allocation) -> None:
    """-H inside an allocation must name its nodes (short and full names match each other)."""
    allocated = {_short(n) for n in alloc.names}
    outside = [h.name for h in hosts if _short(h.name) not in allocated]
    if outside:
        job = f"{alloc.scheduler} job {alloc.job_id}".rstrip()
        raise UsageError(f"--hosts: {', '.join(outside)} not in {job}'s allocation "
                         f"({', '.join(alloc.names)}); name allocated nodes or leave out -H")


# --- placement: hosts, -np and how they are reached --------------------------------------------

VIAS = ("auto", "ssh", "slurm")  # --launcher's choices: how the hosts are reached


@dataclass(frozen=True)
class Placement:
    request: RunRequest  # hosts, -np and how they are reached (via) resolved
    source: str  # where the hosts came from, for --dry-run and --verbose
    allocation: Allocation | None


def choose_via(choice: str, alloc: Allocation | None) -> str:
    """auto: slurm inside a Slurm job, else ssh."""
    if choice not in VIAS:
        raise UsageError(f"--launcher: expected one of {', '.join(VIAS)}, got {choice!r}")
    in_slurm = alloc is not None and alloc.scheduler == SLURM
    if choice == "slurm" and not in_slurm:
        where = f"inside a {alloc.scheduler} job" if alloc is not None else "outside any Slurm job"
        raise UsageError(f"--launcher slurm: this runs {where} (no SLURM_JOB_ID); run it under "
                         "salloc or sbatch, or use --launcher ssh")
    if choice == "auto":
        return "slurm" if in_slurm else "ssh"
    return choice


def plan_allocation(request: RunRequest, alloc: Allocation | None, choice: str) -> Placement:
    """Hosts and -np from the allocation when none were given; given ones must be in it."""
    via = choose_via(choice, alloc)
    if alloc is None:
        source = "hosts from --hosts/--hostfile" if request.hosts else "hosts: this machine"
        return Placement(dataclasses.replace(request, via=via), source, None)
    if request.hosts:
        check_hosts_in_allocation(request.hosts, alloc)
        resolved = dataclasses.replace(request, via=via)
        source = (f"hosts from --hosts/--hostfile, inside {alloc.scheduler} job {alloc.job_id}"
                  .rstrip())
    else:
        num_proc = request.num_proc
        if num_proc is None and all(h.slots_given for h in alloc.hosts):
            num_proc = alloc.total_tasks  # else all slots, which the GPUs may still decide
        resolved = dataclasses.replace(request, hosts=alloc.hosts, num_proc=num_proc,
                                       via=via)
        source = alloc.describe()
    # Said as the option that sets it: --launcher.
    return Placement(resolved, f"{source}; launcher {via}", alloc)
