"""MPICH and Intel MPI through Hydra's mpiexec: the command line (pure), its ssh agent, and how
its version, output and failures read.

Hydra starts one proxy per host: on mpiexec's own host by fork, on the others through
`-launcher-exec`, which it calls as `EXEC -x HOST PROXY-COMMAND...`. The proxy command is
Hydra's own (the path of `hydra_pmi_proxy` and its control port); the ranks' program and
arguments travel over the proxy's control connection, never through a remote shell.
`-launcher-exec` takes one executable, not a command with arguments, so dtlaunch writes a tiny
agent that runs its ssh wrapper (dtlaunch.agents.rsh) with the same ssh options Open MPI gets.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dtlaunch.agents import PIPE_BUF
from dtlaunch.core.errors import UsageError
from dtlaunch.core.mpi_kinds import INSTALL_MPICH_HINT
from dtlaunch.core.textfile import read_launcher_file
from dtlaunch.job.binding import intel_pinning
from dtlaunch.job.hosts import Host, assign_ranks, format_hosts
from dtlaunch.mpi import (
    HYDRA_FAMILY,
    SLURM,
    SSH,
    Interfaces,
    JobSpec,
    MpiFamily,
    MpiImpl,
)
from dtlaunch.reach.ssh_options import refuse_any_host_key

if TYPE_CHECKING:  # imported when a job runs, not for a dry run
    from dtlaunch.core.failure import Failure
    from dtlaunch.hydra.output import HydraDemux

# What picks how Hydra reaches the hosts (its -launcher, formerly -bootstrap, and so how ssh is
# run), on its command line or in its environment.
BOOTSTRAP_ARGS = ("-launcher", "-launcher-exec", "-bootstrap", "-bootstrap-exec", "-rsh", "-ssh")
BOOTSTRAP_VARIABLES = ("HYDRA_LAUNCHER", "HYDRA_LAUNCHER_EXEC", "HYDRA_BOOTSTRAP",
                       "HYDRA_BOOTSTRAP_EXEC", "I_MPI_HYDRA_BOOTSTRAP", "I_MPI_HYDRA_BOOTSTRAP_EXEC")


SupportFile = tuple[str, str]  # (path, text) written (mode 0700) before the job starts


def agent_script(python: str, rsh_file: str, ssh_args: Sequence[str]) -> str:
    """The `-launcher-exec` program: dtlaunch.agents.rsh with the job's ssh options in front of
    Hydra's own arguments. It starts with -I -S: only the standard library is needed. The
    agent is imported from its folder, put last on the path (no standard module is shadowed),
    as a plain module: its byte code is cached, and importlib.util would cost ~5 ms a host."""
    folder, name = os.path.split(rsh_file)
    return (
        f"#!{python} -IS\n"
        "# Hydra's -launcher-exec for one set of ssh options, written by dtlaunch.\n"
        "import sys\n"
        f"sys.path.append({folder!r})\n"
        f"import {os.path.splitext(name)[0]} as rsh\n"
        f"sys.exit(rsh.main([*{tuple(ssh_args)!r}, *sys.argv[1:]], end_with_parent=True))\n"
    )


def agent_path(directory: str, script: str) -> str:
    """Named by its content: a changed option or dtlaunch version gets a new file."""
    digest = hashlib.sha256(script.encode()).hexdigest()[:16]
    return str(Path(directory) / f"hydra-ssh-{digest}")


def ranks_per_host(hosts: Sequence[Host], num_proc: int) -> list[tuple[str, int]]:
    """How many ranks each host gets, filling hosts in slot order as `-hosts h1:2,h2:2` does
    (again from the first host when there are more ranks than slots); hosts left out get none."""
    return list(Counter(assign_ranks(hosts, num_proc)).items())


def placement_args(spec: JobSpec, intel: bool) -> tuple[list[str], list[list[str]]]:
    """(global arguments, one argument set per host or none) that place the ranks host by host.

    MPICH: `-n N -hosts h1:2,h2:2`. Intel MPI's Hydra ignores `:N` there (it places as many
    ranks on a host as it has cores): the same count on every host becomes `-n N -hosts h1,h2
    -ppn 2`, different counts one argument set per host, `-n 2 -host h1 PROGRAM : -n 1 -host
    h2 PROGRAM` (ranks are numbered in that order)."""
    if not intel:
        return ["-n", str(spec.num_proc), "-hosts", format_hosts(spec.hosts)], []
    counts = ranks_per_host(spec.hosts, spec.num_proc)
    if len({n for _, n in counts}) == 1:
        return ["-n", str(spec.num_proc), "-hosts", ",".join(h for h, _ in counts),
                "-ppn", str(counts[0][1])], []
    return [], [["-n", str(n), "-host", name] for name, n in counts]


def build_mpiexec_argv(spec: JobSpec, mpiexec: str = "mpiexec",
                       launcher_exec: str | None = None, intel: bool = False) -> tuple[str, ...]:
    """The whole mpiexec command line, as an argv tuple (never a shell string).

    Variables go by name only (`-genvlist`): their values stay in mpiexec's environment and
    reach the proxies over their control connection, never a command line. `-genvlist` also
    stops Hydra's default of exporting mpiexec's whole environment."""
    if spec.tree_spawn:
        raise UsageError("--tree-spawn: Open MPI's; Hydra (MPICH, Intel MPI) starts every proxy "
                         "from mpiexec")
    placement, per_host = placement_args(spec, intel)
    argv: list[str] = [mpiexec, *placement]
    if spec.via == SLURM:
        argv += ["-launcher", "slurm"]
    else:
        argv += ["-launcher", "ssh", "-launcher-exec", launcher_exec or "ssh"]
    if spec.iface is not None:  # Hydra's -iface takes one name (its proxies connect back over it)
        if spec.iface.cidrs:
            raise UsageError("--iface: Hydra (MPICH, Intel MPI) takes an interface name, not a "
                             "subnet; give the name (e.g. eth0)")
        argv += ["-iface", spec.iface.names[0]]
    argv.append("-prepend-rank")
    names = [v.name for v in spec.env.variables if not v.inline]
    argv += ["-genvlist", ",".join(names)] if names else ["-genvnone"]
    for var in spec.env.variables:
        if var.inline:
            argv += ["-genv", var.name, var.value]
    # libfabric's TCP provider (Intel MPI's data path; MPICH's with its OFI netmod) picks an
    # interface of its own, a docker0 bridge as readily as eth0 (measured: Intel MPI's ranks
    # then wait for ever): the `--iface` name pins it too, unless the job sets FI_TCP_IFACE.
    if spec.iface is not None and not any(v.name == "FI_TCP_IFACE" for v in spec.env.variables):
        argv += ["-genv", "FI_TCP_IFACE", spec.iface.names[0]]
    if intel:
        for name, value in intel_pinning(spec.binding or (), spec.mpi_args):
            argv += ["-genv", name, value]
    elif spec.binding is not None:
        argv += spec.binding
    argv += spec.mpi_args
    if not per_host:
        return (*argv, *spec.program)
    for i, local in enumerate(per_host):
        argv += [*([":"] if i else []), *local, *spec.program]
    return tuple(argv)


class Hydra(MpiFamily):
    """MPICH >= 3.0 and Intel MPI through Hydra's mpiexec. The ssh options are in the agent file
    (support_files), not the launcher's environment; Hydra reads no parameter file by default."""

    launcher = "mpiexec"
    install_hint = INSTALL_MPICH_HINT
    record_limit = PIPE_BUF  # Hydra's -prepend-rank does not let pieces be joined exactly
    ends_job_on_rank_failure = False

    def __init__(self, agent_dir: str = "", python: str = "", rsh_file: str = "",
                 name: str = "MPICH") -> None:
        # Where the ssh agent is written, and what it runs; empty: plain ssh (no options).
        self.agent_dir = agent_dir
        self.python = python
        self.rsh_file = rsh_file
        self.name = name  # "MPICH" or "Intel MPI": how the ranks are placed differs

    def unsupported(self, impl: MpiImpl, program: str) -> str | None:
        if impl.family != HYDRA_FAMILY:
            return f"{program} is {impl.name}, not MPICH or Intel MPI"
        least = impl.needs_newer()
        if least is not None:
            return f"{program} is {impl.name} {impl.version}; dtlaunch needs >= {least}"
        return None

    def _agent(self, spec: JobSpec) -> SupportFile | None:
        if spec.via != SSH or not (self.agent_dir and self.python and self.rsh_file):
            return None
        script = agent_script(self.python, self.rsh_file, spec.ssh.launcher_ssh_args())
        return agent_path(self.agent_dir, script), script

    def build_argv(self, spec: JobSpec, launcher: str) -> tuple[str, ...]:
        agent = self._agent(spec)
        return build_mpiexec_argv(spec, launcher, agent[0] if agent else None,
                                  intel=self.name == "Intel MPI")

    def support_files(self, spec: JobSpec) -> tuple[SupportFile, ...]:
        agent = self._agent(spec)
        return (agent,) if agent else ()

    def new_demux(self, stream: str, release: tuple[int, ...] = ()) -> HydraDemux:
        from dtlaunch.hydra.output import HydraDemux

        return HydraDemux(stream)

    def parse_failure(self, lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None:
        from dtlaunch.hydra.output import analyze_hydra

        return analyze_hydra(lines, rank_hosts)

    def refuse_insecure(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> None:
        if any(a in BOOTSTRAP_ARGS for a in extra_args):
            refuse_any_host_key(f"--mpi-args {' '.join(extra_args)!r}", " ".join(extra_args))
        for name in BOOTSTRAP_VARIABLES:
            if name in environ:
                refuse_any_host_key(f"the environment's {name}", environ[name])

    def refuse_insecure_files(self, launcher: str, extra_args: Sequence[str],
                              environ: Mapping[str, str]) -> None:
        """Hydra's configuration files (mpiexec options read before the command line's):
        HYDRA_CONFIG_FILE's, and the installation's (its sysconfdir: beside the launcher's
        prefix, or /etc)."""
        prefix = os.path.dirname(os.path.dirname(launcher)) if launcher else ""
        named = (environ["HYDRA_CONFIG_FILE"],) if environ.get("HYDRA_CONFIG_FILE") else ()
        beside = (os.path.join(prefix, "etc", "mpiexec.hydra.conf"),) if prefix else ()
        for path in (*named, *beside, "/etc/mpiexec.hydra.conf"):
            text = read_launcher_file(path, "Hydra's configuration file")
            if text is not None:
                refuse_any_host_key(f"Hydra's configuration file {path}", text)

    def ssh_left_to_dtlaunch(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> bool:
        """--mpi-args or HYDRA_*/I_MPI_HYDRA_* variables that pick another -launcher could
        weaken host-key checking."""
        return not (any(a in BOOTSTRAP_ARGS for a in extra_args)
                    or any(name in BOOTSTRAP_VARIABLES for name in environ))

    def job_iface(self, chosen: Interfaces, common_name: str | None) -> Interfaces | None:
        # Hydra's -iface takes one name: the chosen network's, when every host calls it the
        # same; else Hydra picks (the ranks' data path is UCX's choice anyway).
        return Interfaces(names=(common_name,)) if common_name else None


HYDRA = Hydra()
