"""`dtlaunch run`'s options to the one LaunchRequest (`config_from_args`) that the run,
`--dry-run`, `submit` and a library caller all start from: horovodrun's spellings folded into
dtlaunch's own options, the command read as horovodrun reads it, `--env-file` merged with `-x`,
the restart policy or the elastic spec, every check that needs no host.

The CLI (the only module with click) hands over plain values; the only I/O here is reading the
files the user named (`--env-file`, `--config-file`, `--ssh-config`, the hostfile) and asking
whether a script exists.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from dtlaunch.console.hostfile import HostArgs
from dtlaunch.core.errors import DtlaunchError, UsageError
from dtlaunch.horovod.options import HorovodArgs
from dtlaunch.job.command import parse_command, suggest_option
from dtlaunch.job.env import looks_secret, merge_env_items, read_env_file
from dtlaunch.mpi import Interfaces, parse_iface, split_mpi_args
from dtlaunch.plan.plan import RunRequest

if TYPE_CHECKING:
    from dtlaunch.run.request import LaunchRequest
    from dtlaunch.run.restarts import RestartPolicy


@dataclass(frozen=True)
class RunOptions(HostArgs):
    """`dtlaunch run`'s options as given, nothing checked yet: the CLI's parameters by name, or
    a library caller's (`RunOptions(hosts="a:2,b:2", program=("train.py",))`)."""

    num_proc: int | None = None
    oversubscribe: bool = False
    env_items: tuple[str, ...] = ()  # -x
    env_file: str | None = None
    module: str | None = None  # -m
    mpi_args: str | None = None
    output_dir: str | None = None
    ranks_spec: str | None = None  # --ranks
    local_ranks_spec: str | None = None  # --local-ranks-filter
    as_json: bool = False
    timeout: float | None = None
    tree_spawn: bool = False
    ssh_default_kex: bool = False
    no_check: bool = False
    dry_run: bool = False
    verbose: bool = False
    max_restarts: int | None = None
    min_np: int | None = None
    restart_delay: float | None = None
    # The job kinds' own options (dtlaunch.jobkind.KindOptions), by param: {"torch": True}.
    kinds: Mapping[str, Any] = field(default_factory=dict)
    program: tuple[str, ...] = ()  # the command and its words, untouched
    unknown: tuple[str, ...] = ()  # what the parser left before the program: unknown options
    horovod: Mapping[str, Any] = field(default_factory=dict)  # horovodrun's, by parameter name

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RunOptions:
        """From the CLI's parsed parameters: dtlaunch's own by name, click's left-over `args`,
        and the rest (horovodrun's options) as they are."""
        from dtlaunch.jobkind import kind_options

        own = {f.name for f in fields(cls)} - {"unknown", "horovod", "kinds"}
        kinds = {o.param for k in kind_options().values() for o in k.run}
        return cls(**{k: v for k, v in params.items() if k in own},
                   unknown=tuple(params.get("args", ())),
                   kinds={k: v for k, v in params.items() if k in kinds},
                   horovod={k: v for k, v in params.items()
                            if k not in own and k not in kinds and k != "args"})


def resolve_iface(iface: str | None, hvd: HorovodArgs) -> Interfaces | None:
    """--iface, or horovodrun's --network-interface(s) (the same thing: give one)."""
    if iface is not None and hvd.network_interfaces:
        raise UsageError("--iface and --network-interface(s) name the same thing; give one")
    if hvd.network_interfaces:
        return parse_iface(",".join(hvd.network_interfaces))
    return parse_iface(iface) if iface is not None else None


def resolve_output_dir(output_dir: str | None, hvd: HorovodArgs) -> str | None:
    """--output-dir (or horovodrun's --output-filename): a directory, or a path where one can
    be made, found now, not after the pre-flight."""
    if output_dir is not None and hvd.output_filename is not None:
        raise UsageError("--output-dir and --output-filename name the same thing; give one")
    path = output_dir if output_dir is not None else hvd.output_filename
    if path is None:
        return None
    option = "--output-dir" if output_dir is not None else "--output-filename"
    if not path:
        raise UsageError(f"{option}: empty path")
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        current = os.path.dirname(current)
    if not os.path.isdir(current):
        what = "exists and is" if current == os.path.abspath(path) else f"is in {current}, which is"
        raise UsageError(f"{option}: {path} {what} not a directory")
    if not os.access(current, os.W_OK | os.X_OK):
        raise UsageError(f"{option}: cannot write in {current} (permission denied)")
    return path


def read_horovod(options: RunOptions) -> HorovodArgs:
    """horovodrun's options among run's, with --config-file read."""
    from dtlaunch.horovod.options import HOROVOD_OPTIONS, read_horovod_args

    names = {o.param for o in HOROVOD_OPTIONS}
    return read_horovod_args({k: v for k, v in options.horovod.items() if k in names})


def config_from_args(options: RunOptions, known_options: Collection[str] = (),
                     hvd: HorovodArgs | None = None) -> LaunchRequest:
    """`dtlaunch run`'s options to the one LaunchRequest that the run, `--dry-run`, `submit` and
    a library caller all start from, with every check that needs no host: a bad value is a
    UsageError here. `known_options`: the spellings the parser knows (for 'did you mean');
    `hvd`: horovodrun's options, when the caller has read them already."""
    from dtlaunch.run.request import LaunchRequest

    hvd = read_horovod(options) if hvd is None else hvd
    if options.unknown:  # what click left before the program: options it does not know
        raise UsageError(f"run: unknown option {options.unknown[0]}"
                         f"{suggest_option(options.unknown[0], known_options)}")
    ranks = None
    if options.ranks_spec is not None and options.local_ranks_spec is not None:
        raise UsageError("--ranks and --local-ranks-filter both pick the ranks shown; give one")
    spec = options.ranks_spec if options.ranks_spec is not None else options.local_ranks_spec
    if spec is not None:
        from dtlaunch.plan.rank_filter import parse_rank_filter  # imported only when asked

        ranks = parse_rank_filter(spec, local=options.ranks_spec is None)
    request = build_run_request(options, hvd, known_options)
    output_dir = resolve_output_dir(options.output_dir, hvd)
    request, policy = restarts_or_elastic(request, options, hvd)
    request = refine_for_kinds(request, options.kinds)
    if options.as_json and policy is not None:
        raise UsageError("--json goes without --max-restarts (the attempts' report is "
                         "--output-dir's attempts.json)")
    if options.as_json and options.dry_run:
        raise UsageError("--json reports how a job ended; --dry-run starts none")
    return LaunchRequest(
        request, check=not options.no_check, timeout=options.timeout, output_dir=output_dir,
        use_cache=not hvd.disable_cache, prefix_timestamp=hvd.prefix_timestamp,
        start_timeout=float(hvd.start_timeout) if hvd.start_timeout is not None else None,
        ranks=ranks, ranks_to_stderr=options.as_json, restarts=policy)


def build_run_request(options: RunOptions, hvd: HorovodArgs,
                      known_options: Collection[str] = ()) -> RunRequest:
    """The hosts, the command (read as horovodrun reads it) and its environment."""
    from dtlaunch.mpijob.launcher_choice import rsh_agent_command

    hosts = options.read_hosts()
    ssh = options.ssh_options(default_kex=options.ssh_default_kex)
    rsh_agent = rsh_agent_command()
    python = options.python
    if python is not None and not (os.path.isabs(python) or shutil.which(python)):
        raise UsageError(f"--python: {python} is not an absolute path or a command on PATH")
    interpreter = python or sys.executable
    program = parse_command(options.program, python=interpreter, module=options.module,
                            python_given=python is not None, is_file=os.path.isfile,
                            known_options=known_options)
    # With this environment, a bare NAME the file names but nobody set is refused with the
    # file's name and line (not as -x's --env).
    from_file = read_env_file(options.env_file, os.environ) if options.env_file is not None else ()
    return RunRequest(
        hosts=hosts,
        python=interpreter,
        script=program.script,
        module=program.module,
        num_proc=options.num_proc,
        oversubscribe=options.oversubscribe,
        iface=resolve_iface(options.iface, hvd),
        env_items=merge_env_items(from_file, options.env_items),
        ssh=ssh,
        mpi_args=split_mpi_args(options.mpi_args) if options.mpi_args else (),
        tree_spawn=options.tree_spawn,
        rsh_agent=rsh_agent,
        program=program,
        extra_env=hvd.env,
        binding=hvd.binding_args,
        typed_env=tuple(i.partition("=")[0] for i in options.env_items if "=" in i),
        controller=hvd.controller,
        via=options.via,
    )


def restarts_or_elastic(request: RunRequest, options: RunOptions, hvd: HorovodArgs,
                        ) -> tuple[RunRequest, RestartPolicy | None]:
    """--max-restarts' policy, or Horovod's elastic mode (they exclude each other); --min-np
    is the restarts' fewest with --max-restarts, else elastic mode's."""
    max_restarts, min_np, delay = options.max_restarts, options.min_np, options.restart_delay
    elastic = dict(hvd.elastic)
    if min_np is not None and "min_np" in elastic:
        raise UsageError("--min-np and --min-num-proc are the same option; give one")
    if max_restarts is None and min_np is not None:
        elastic["min_np"] = min_np  # without restarts, --min-np is horovodrun's elastic one
        min_np = None
    if elastic:
        request = elastic_request(request, elastic, max_restarts)
    if max_restarts is None and delay is not None:
        raise UsageError("--restart-delay goes with --max-restarts N")
    if max_restarts is None:
        return request, None
    from dtlaunch.run.restarts import RestartPolicy, check_policy  # only now (~7 ms to import)

    return request, check_policy(RestartPolicy(max_restarts, min_np if min_np is not None else 1,
                                               delay or 0.0, options.oversubscribe),
                                 request.num_proc)


def elastic_request(request: RunRequest, given: dict[str, Any], max_restarts: int | None,
                    ) -> RunRequest:
    """An elastic job (Horovod's elastic mode): always on Gloo; restarts are its own."""
    from dtlaunch.job.elastic import elastic_spec

    if max_restarts is not None:
        raise UsageError("--max-restarts restarts a fixed-size job; an elastic job (--min-np, "
                         "--max-np, --host-discovery-script) resets itself: give one of them")
    cooldown = given.get("blacklist_cooldown_range")
    spec = elastic_spec(given.get("min_np"), given.get("max_np"), request.num_proc,
                        given.get("host_discovery_script"), given.get("slots_per_host"),
                        given.get("elastic_timeout"), given.get("reset_limit"),
                        tuple(cooldown) if cooldown else None, bool(request.hosts))
    return replace(request, elastic=spec, controller="gloo")


def refuse_typed_secrets(env_items: Sequence[str]) -> None:
    """`submit`: a secret's value typed after -x is refused: the batch script, which Slurm
    keeps, and the batch node's command line would carry it."""
    for item in env_items:
        name, sep, _ = item.partition("=")
        if sep and looks_secret(name):
            raise UsageError(
                f"submit: -x {name}=...: a value typed here would be written into the batch "
                "script, which Slurm keeps, and onto the batch node's command line; export "
                f"{name} before submitting and pass -x {name} (the job gets your environment), "
                "or put it in an --env-file")


def check_batch_run(request: LaunchRequest) -> None:
    """`submit`'s run, planned here as `run` will plan it on the batch node, so a job that would
    only print a usage error is never queued. The hosts come from the allocation, unknown yet:
    without -H, -np is checked against no slot count."""
    from dtlaunch.job.hosts import Host
    from dtlaunch.mpijob.launcher_choice import family_to_check
    from dtlaunch.plan.plan import plan_run

    family = family_to_check()
    run = request.run
    if not run.hosts:  # from the allocation: any -np may fit it
        run = replace(run, hosts=(Host("node", 1),), oversubscribe=True)
    plan_run(replace(run, via="ssh"), dict(os.environ), family=family)


def check_build_text(python: str | None = None) -> str:
    """horovodrun's --check-build, from what env-check knows of this machine's Horovod: the one
    the job would import (``--python``'s, else dtlaunch's own interpreter's)."""
    from dtlaunch.doctor.envcheck import gather_env
    from dtlaunch.horovod.options import format_check_build

    _, facts = gather_env(python=python)
    py = facts.python
    version = py.horovod_imported or py.horovod_version
    if version is None:
        raise DtlaunchError(f"--check-build: horovod is not installed for {py.executable}; "
                            "see dtlaunch install-horovod")
    return format_check_build(version, py.frameworks, py.controllers, py.tensor_ops)


def refine_for_kinds(request: RunRequest, values: Mapping[str, Any]) -> RunRequest:
    """Each kind's own options read into the request (`KindOptions.refine`, in the registry's
    order): a flag not given is False, another option None."""
    from dtlaunch.jobkind import kind_options

    unknown = set(values) - {o.param for k in kind_options().values() for o in k.run}
    if unknown:
        raise UsageError(f"run: no kind of job has the option {sorted(unknown)[0]}")
    for kind in kind_options().values():
        given = {o.param: values.get(o.param, False if o.type is None else None) for o in kind.run}
        request = kind.refine(request, given)
    return request
