"""Open MPI's mpirun: the command line (pure), and how its output, failures and version read.

The long options use the double-dash forms (`--bind-to`, `--map-by`, `--mca`): Open MPI 5's
mpirun (prterun) rejects the single-dash ones, and Open MPI 3 and 4 accept both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dtlaunch.agents import SSH_ARGS_ENV
from dtlaunch.job.binding import binding_for, double_dash
from dtlaunch.job.hosts import across_machines, format_hosts
from dtlaunch.mpi import (
    INSTALL_OMPI_HINT,
    MIN_OMPI,
    OPEN_MPI_FAMILY,
    SLURM,
    SSH,
    JobSpec,
    MpiFamily,
    MpiImpl,
)
from dtlaunch.openmpi.mca import (
    foreign_plm_choice,
    names_plm,
    param_files_choose_plm,
    param_files_set_ssh,
    refuse_insecure,
    refuse_insecure_files,
    ssh_overrides,
)
from dtlaunch.reach.ssh_options import check_rsh_arg

if TYPE_CHECKING:  # imported when a job runs, not for a dry run
    from dtlaunch.core.failure import Failure
    from dtlaunch.openmpi.output import OpenMpiDemux

DEFAULT_MAJOR = 4  # assumed when the local mpirun cannot be asked (a dry run without one)


def build_mpirun_argv(spec: JobSpec, mpirun: str = "mpirun") -> tuple[str, ...]:
    """The whole mpirun command line, as an argv tuple (never a shell string)."""
    major = spec.mpi_version[0] if spec.mpi_version else DEFAULT_MAJOR
    argv: list[str] = [mpirun]
    if spec.as_root:
        argv.append("--allow-run-as-root")
    argv += ["--tag-output", "-np", str(spec.num_proc), "-H", format_hosts(spec.hosts)]
    argv += double_dash(binding_for(spec.mpi_args, spec.binding))
    if spec.oversubscribe:
        argv.append("--oversubscribe")
    # Point-to-point transports: shared memory within a host (`vader` in Open MPI 3 and 4,
    # `sm` in 5), TCP between hosts. Naming them (not horovodrun's `^openib`) keeps same-host
    # ranks off TCP and never picks up InfiniBand verbs or UCX paths that hang without them.
    argv += ["--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp" if major >= 5 else "self,vader,tcp"]
    if spec.iface is not None:
        value = ",".join(spec.iface.names or spec.iface.cidrs)
        argv += ["--mca", "btl_tcp_if_include", value, "--mca", "oob_tcp_if_include", value]
    if spec.via == SLURM:
        # srun starts one daemon per node inside the job's allocation; srun's exit (and
        # scancel) ends them. No ssh options apply.
        argv += ["--mca", "plm", "slurm"]
    else:
        argv += _rsh_args(spec, major)
    for var in spec.env.variables:
        argv += ["-x", f"{var.name}={var.value}" if var.inline else var.name]
    argv += double_dash(spec.mpi_args)  # the binding options' names only
    argv += spec.program
    return tuple(argv)


def uses_agent(spec: JobSpec) -> bool:
    """dtlaunch's ssh wrapper starts the daemons (tree spawn runs plain ssh on the hosts too)."""
    return bool(spec.rsh_agent) and not spec.tree_spawn and spec.via == SSH


def _rsh_args(spec: JobSpec, major: int) -> list[str]:
    # Keep each host's daemon attached to its ssh session (Open MPI detaches it by default):
    # a dead host or sshd then ends that session, which dtlaunch notices, and the daemons'
    # own error messages reach the user.
    args = ["--leave-session-attached"]
    if uses_agent(spec):
        args += ["--mca", "plm_rsh_agent", spec.rsh_agent or "ssh"]
    else:
        # plm_rsh_args reaches a remote shell: only paths without shell syntax may pass.
        ssh = spec.ssh
        for value, option in ((ssh.identity_file, "--ssh-identity-file"),
                              (ssh.config_file, "--ssh-config")):
            if value:
                check_rsh_arg(value, option)
        args += ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
                 " ".join(ssh.tree_ssh_args() if spec.tree_spawn else ssh.ssh_args())]
    if OPEN_MPI.overrides_launcher_files(spec):
        # A parameter file names a plm for one machine (an image's plm = isolated): the
        # command line wins over it. ORTE calls ssh's component rsh, PRRTE (5.x) ssh.
        args += ["--mca", "plm", "ssh" if major >= 5 else "rsh"]
    if not spec.tree_spawn:
        # Only ssh from this machine to each host is needed (and checked by doctor); tree
        # spawn would also need every host to reach every other host over SSH.
        args += ["--mca", "plm_rsh_no_tree_spawn", "1"]
    return args


class OpenMpi(MpiFamily):
    """Open MPI >= 3.0 through its mpirun (the MpiFamily that dtlaunch launches with today).
    It takes its ssh agent as a command line (no support files) and the chosen network as is."""

    name = "Open MPI"
    launcher = "mpirun"
    install_hint = INSTALL_OMPI_HINT
    # The rank shim's largest record: `--tag-output` lets dtlaunch join each rank's pieces
    # exactly, so a record need not be one atomic write (see dtlaunch.agents.rank_shim).
    record_limit = 1 << 20
    ends_job_on_rank_failure = True
    # The parameter files it reads by default, which may choose its plm or set its ssh.
    stray_launcher_files = staticmethod(param_files_choose_plm)
    ssh_setting_files = staticmethod(param_files_set_ssh)
    refuse_insecure = staticmethod(refuse_insecure)

    def unsupported(self, impl: MpiImpl, program: str) -> str | None:
        if impl.family != OPEN_MPI_FAMILY:
            return f"{program} is {impl.name}, not Open MPI; dtlaunch needs Open MPI >= 3.0"
        if impl.release < MIN_OMPI:
            return f"{program} is Open MPI {impl.version}; dtlaunch needs >= 3.0"
        return None

    def build_argv(self, spec: JobSpec, launcher: str) -> tuple[str, ...]:
        return build_mpirun_argv(spec, launcher)

    def new_demux(self, stream: str, release: tuple[int, ...] = ()) -> OpenMpiDemux:
        from dtlaunch.openmpi.output import OpenMpiDemux

        # `--tag-output` writes `[1,0]<stdout>: ` (one space) from Open MPI 5 on, none before.
        return OpenMpiDemux(stream, space_after_tag=release[:1] >= (5,))

    def parse_failure(self, lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None:
        from dtlaunch.openmpi.failures import analyze

        return analyze(lines, rank_hosts)

    def launcher_env(self, spec: JobSpec) -> dict[str, str]:
        """The wrapper's ssh options travel in mpirun's environment, never on a daemon's command
        line (Open MPI puts its MCA parameters there inside double quotes, for a remote shell)."""
        return {SSH_ARGS_ENV: json.dumps(spec.ssh.launcher_ssh_args())} if uses_agent(spec) else {}

    def launcher_defaults(self, spec: JobSpec) -> dict[str, str]:
        if spec.via != SLURM:
            return {}
        # plm slurm starts the daemons with srun; their step shares CPUs with other steps:
        # after a lost node, the stopped attempt's step lingers until slurmctld declares the
        # node down (minutes), and the next attempt's daemons must not wait for it.
        return {"OMPI_MCA_plm_slurm_args": "--overlap"}

    def stray_launcher_env(self, spec: JobSpec, env: Mapping[str, str]) -> tuple[str, ...]:
        """A launcher other than ssh's, chosen by the environment, for a job that dtlaunch
        starts over ssh across machines (under Slurm, `--mca plm slurm` on the command line
        wins over it anyway)."""
        if spec.via != SSH or not across_machines(spec.hosts):
            return ()
        return foreign_plm_choice(env)

    def overrides_launcher_files(self, spec: JobSpec) -> bool:
        """A job over ssh across machines, whose parameter files choose another plm, and whose
        --mpi-args do not choose one themselves."""
        return (bool(spec.launcher_set_in) and spec.via == SSH and across_machines(spec.hosts)
                and not names_plm(spec.mpi_args))

    def ssh_left_to_dtlaunch(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> bool:
        """--mpi-args or OMPI_MCA_*/PRTE_MCA_* variables that set the launch agent or its
        arguments could weaken mpirun's host-key checking."""
        return not ssh_overrides(extra_args, environ)

    def refuse_insecure_files(self, launcher: str, extra_args: Sequence[str],
                              environ: Mapping[str, str]) -> None:
        refuse_insecure_files(launcher, extra_args, environ,
                              environ.get("HOME") or os.path.expanduser("~"))


OPEN_MPI = OpenMpi()
