"""From the user's request to the exact launch plan. Pure: no I/O, no environment reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dtlaunch.agents import ship
from dtlaunch.core.errors import UsageError
from dtlaunch.job.command import Program
from dtlaunch.job.command import check_module_name as check_module_name  # re-exported for the CLI
from dtlaunch.job.env import EnvPlan, build_launcher_env, plan_environment, slurm_launch_env
from dtlaunch.job.hosts import MAX_NUM_PROC, Host, assign_ranks, total_slots
from dtlaunch.mpi import SLURM, SSH, Interfaces, JobSpec, MpiFamily, format_command
from dtlaunch.reach.ssh_options import SshOptions

if TYPE_CHECKING:  # an elastic job's spec is built (and its module imported) by its own option
    from dtlaunch.job.elastic import ElasticSpec


@dataclass(frozen=True)
class RunRequest:
    hosts: tuple[Host, ...]  # empty: this machine
    python: str
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    num_proc: int | None = None
    oversubscribe: bool = False
    iface: Interfaces | None = None
    env_items: tuple[str, ...] = ()
    ssh: SshOptions = field(default_factory=SshOptions)
    mpi_args: tuple[str, ...] = ()
    timeline: str | None = None
    tree_spawn: bool = False
    rsh_agent: str | None = None
    # The ranks' command from dtlaunch.job.command.parse_command; when set, script/module/args
    # are not used.
    program: Program | None = None
    # Variables dtlaunch sets for every rank besides its own (horovodrun's options, the
    # network it chose); `-x` still beats them.
    extra_env: tuple[tuple[str, str], ...] = ()
    # How the hosts are reached to start the job (--launcher): "ssh", "slurm" (srun, inside a
    # Slurm job) or "auto" (slurm inside a Slurm job); session.prepare resolves "auto".
    via: str = "auto"
    binding: tuple[str, ...] | None = None  # --binding-args; None: dtlaunch's default
    # Names whose -x NAME=VALUE was typed on dtlaunch's command line (a secret's value there
    # deserves a warning: it stays in dtlaunch's process entry while the job runs).
    typed_env: tuple[str, ...] = ()
    # How the ranks are started and meet (dtlaunch.jobkind's registry): "mpi" (an MPI
    # launcher starts them), "gloo" (Horovod's Gloo controller; dtlaunch starts them itself)
    # or "torch" (torch.distributed with torchrun's contract, see dtlaunch.torchrun).
    controller: str = "mpi"
    # Horovod's elastic mode (always with controller "gloo"): None for a fixed-size job.
    elastic: ElasticSpec | None = None
    # The kind's own settings, made and read in its folder (--torch's TorchSpec); None: none.
    spec: object | None = None


@dataclass(frozen=True)
class RunPlan:
    argv: tuple[str, ...]  # the launcher's command as one would type it (what is shown)
    launcher_env: dict[str, str]
    rank_hosts: tuple[str, ...]
    env: EnvPlan
    hosts: tuple[Host, ...]
    family: MpiFamily = field(compare=False)  # how the job is started
    # Variables the launcher needs beyond the ranks' (dtlaunch's ssh options): shown first.
    shown_env: tuple[tuple[str, str], ...] = ()
    support_files: tuple[tuple[str, str], ...] = ()  # (path, text) written before the start
    # What runs: `argv` with each rank started through dtlaunch.agents.rank_shim.
    launch_argv: tuple[str, ...] = ()
    # (name, value) set here but kept from the launcher: they would defeat how it starts the job
    # (MpiFamily.stray_launcher_env).
    left_out_env: tuple[tuple[str, str], ...] = ()
    # "FILE: plm = VALUE" chosen in a parameter file and overridden on the command line
    # (MpiFamily.overrides_launcher_files).
    launcher_overridden: tuple[str, ...] = ()

    def display(self) -> str:
        """Shell-quoted and pasteable; values of secrets never appear in it."""
        return format_command(self.argv, self.shown_env)


def choose_num_proc(hosts: tuple[Host, ...], num_proc: int | None, oversubscribe: bool,
                    local: bool = False) -> int:
    """-np, or all the slots. More than the slots needs --oversubscribe, on this machine
    (`local`: no hosts given, one slot per core) as on hosts."""
    slots = total_slots(hosts)
    if num_proc is not None and num_proc < 1:
        raise UsageError(f"-np: must be at least 1, got {num_proc}")
    chosen = slots if num_proc is None else num_proc
    if chosen > MAX_NUM_PROC:
        what = f"{chosen} processes" if num_proc is not None else f"all {chosen} slots"
        raise UsageError(f"-np: {what} is more than the {MAX_NUM_PROC} dtlaunch starts")
    if chosen > slots and not oversubscribe:
        if local:
            raise UsageError(f"-np: {chosen} processes but this machine has only {slots} cores "
                             "(one slot each without -H); pass --oversubscribe to run more "
                             "processes than cores")
        raise UsageError(f"-np: {chosen} processes but the hosts have only {slots} slots; "
                         "add slots (host:N) or pass --oversubscribe")
    return chosen


def build_program(request: RunRequest) -> tuple[str, ...]:
    if request.program is not None:
        return request.program.argv
    if request.module is not None:
        return (request.python, "-m", check_module_name(request.module), *request.args)
    if request.script is None:
        raise UsageError("run: give a SCRIPT to run or -m MODULE")
    return (request.python, request.script, *request.args)


def shim_python(request: RunRequest) -> str:
    """The interpreter the rank shim runs with on the hosts: the ranks' own when dtlaunch can
    tell it (the pre-flight checks it there), else python3 from the hosts' PATH."""
    if request.program is not None:
        return request.program.python or "python3"
    return request.python


def plan_run(request: RunRequest, environ: Mapping[str, str], *, family: MpiFamily,
             mpi_version: tuple[int, ...] = (), as_root: bool = False, cpu_count: int = 1,
             launcher_set_in: tuple[str, ...] = ()) -> RunPlan:
    """`launcher_set_in`: the plm choices in the launcher's parameter files
    (MpiFamily.stray_launcher_files, read by the caller)."""
    # No hosts given: this machine, one slot per core.
    hosts = request.hosts or (Host("localhost", max(cpu_count, 1)),)
    num_proc = choose_num_proc(hosts, request.num_proc, request.oversubscribe,
                               local=not request.hosts)
    program = build_program(request)
    fixed: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if request.iface is not None and request.iface.names:
        # NCCL and Gloo take names only; a CIDR is resolved per host by doctor.
        fixed["NCCL_SOCKET_IFNAME"] = ",".join(request.iface.names)
        fixed["HOROVOD_GLOO_IFACE"] = request.iface.names[0]
    if request.timeline:
        fixed["HOROVOD_TIMELINE"] = request.timeline
    fixed.update(request.extra_env)
    family.refuse_insecure(request.mpi_args, environ)
    env = plan_environment(environ, request.env_items, fixed, typed=request.typed_env)
    spec = JobSpec(hosts=hosts, num_proc=num_proc, program=program, env=env, iface=request.iface,
                   ssh=request.ssh, as_root=as_root, oversubscribe=request.oversubscribe,
                   tree_spawn=request.tree_spawn, mpi_version=mpi_version,
                   mpi_args=request.mpi_args, rsh_agent=request.rsh_agent,
                   via=SSH if request.via == "auto" else request.via, binding=request.binding,
                   launcher_set_in=launcher_set_in)
    argv = family.build_argv(spec, family.launcher)
    # What really runs: every rank through the rank shim, its argv one opaque word.
    # Records as large as the launcher can take apart.
    wrapped = ship("rank_shim.py").inline(program, shim_python(request), family.record_limit)
    launch_argv = family.build_argv(replace(spec, program=wrapped), family.launcher)
    launcher_env = build_launcher_env(environ, env)
    own = family.launcher_env(spec)
    launcher_env.update(own)
    if spec.via == SLURM:
        # The launcher reads the Slurm job from these, to start its daemons with srun.
        launcher_env.update(slurm_launch_env(environ))
    for name, value in family.launcher_defaults(spec).items():
        launcher_env.setdefault(name, value)
    left_out = tuple((name, launcher_env.pop(name))
                     for name in family.stray_launcher_env(spec, launcher_env))
    overridden = launcher_set_in if family.overrides_launcher_files(spec) else ()
    return RunPlan(argv=argv, launcher_env=launcher_env, rank_hosts=assign_ranks(hosts, num_proc),
                   env=env, hosts=hosts, family=family, shown_env=tuple(own.items()),
                   support_files=family.support_files(spec),
                   launch_argv=launch_argv, left_out_env=left_out, launcher_overridden=overridden)
