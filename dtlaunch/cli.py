"""Command-line interface: parse flags, call the library, map errors to exit codes.

With cli_options.py, the only module that imports click. Heavy modules (paramiko, rich,
torch) are imported inside the commands that need them, so `dtlaunch --help` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from dtlaunch import __version__
from dtlaunch.console.options import (
    RUN_OWN_FLAGS,
    SECONDS,
    RunCommand,
    horovod_click_options,
    host_options,
    single_option,
)
from dtlaunch.core.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    DtlaunchError,
    UsageError,
)
from dtlaunch.core.interrupts import Interrupted, signals_raise

if TYPE_CHECKING:
    from dtlaunch.horovod.options import HorovodArgs
    from dtlaunch.plan.plan import RunRequest
    from dtlaunch.plan.rank_filter import RankFilter
    from dtlaunch.run.restarts import RestartPolicy, RestartReport
    from dtlaunch.run.session import RunOutcome


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dtlaunch")
def cli() -> None:
    """Launch Horovod training jobs on Open MPI, checked before they start."""


def _warn(message: str) -> None:
    click.echo(f"dtlaunch: warning: {message}", err=True)


def _note(message: str) -> None:
    click.echo(f"dtlaunch: {message}", err=True)


def _event_printer(verbose: bool, line: Any = None) -> Callable[[Any], None]:
    """How the CLI shows a run's events on stderr; progress goes to `line` (a ProgressLine)."""
    from dtlaunch.run.events import EventLevel

    def show(event: Any) -> None:
        if event.level is EventLevel.PROGRESS:
            if line is not None and event.progress is not None:
                line.update(event.progress)
            return
        if event.level is EventLevel.REPORT:
            if line is not None:
                line.pause()
            if event.report is not None:
                _print_job_report(event.report)
            return
        shown = event.level in (EventLevel.WARNING, EventLevel.NOTE) or verbose
        if line is not None and shown:
            line.pause()  # a message: the live line steps aside, the next count redraws it
        if event.level is EventLevel.WARNING:
            _warn(event.text)
        elif shown:
            _note(event.text)

    return show


@cli.command(cls=RunCommand,
             context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@host_options
@single_option("-np", "--num-proc", "num_proc", type=int, metavar="N",
               help="Number of processes (default: all slots).")
@click.option("--oversubscribe", is_flag=True, help="Allow more processes than slots.")
@click.option("-x", "--env", "env_items", multiple=True, metavar="NAME[=VALUE]",
              help="Export a variable to every rank (repeatable).")
@single_option("--env-file", metavar="FILE",
               help="Export the NAME=VALUE lines of FILE to every rank (-x beats the file).")
@single_option("-m", "module", metavar="MODULE", help="Run a module, like python -m.")
@single_option("--mpi-args", metavar="ARGS", help="Extra mpirun arguments, split like a shell.")
@single_option("--output-dir", metavar="DIR", help="Also write each rank's output to DIR/rank.N.log.")
@single_option("--ranks", "ranks_spec", metavar="SPEC",
               help="Show only these ranks' output on the console: 0, 0,3-5, last or all "
                    "(--output-dir still gets every rank's; failures always show).")
@single_option("--local-ranks-filter", "--local_ranks_filter", "local_ranks_spec", metavar="SPEC",
               help="torchrun's spelling: show only these local ranks (index on each host).")
@click.option("--json", "as_json", is_flag=True,
              help="At the end, print how the job ended as one JSON document on stdout (the "
                   "ranks' output then goes to stderr).")
@single_option("--timeout", type=SECONDS, metavar="SECONDS",
               help="Stop the whole job after this long.")
@click.option("--tree-spawn", is_flag=True,
              help="Let Open MPI spawn daemons in a tree (needs SSH between every pair of hosts).")
@click.option("--ssh-default-kex", is_flag=True,
              help="Keep ssh's own key exchange order for the job's links (dtlaunch otherwise "
                   "offers a fast one first where OpenSSH 9.x's default is slow; docs/security.md).")
@click.option("--no-check", is_flag=True, help="Skip the pre-flight checks.")
@click.option("--dry-run", is_flag=True, help="Print the mpirun command and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Print the command before running it.")
@single_option("--max-restarts", type=int, metavar="N",
               help="Start a failed job again up to N times, without the hosts that failed.")
@single_option("--min-np", type=int, metavar="N",
               help="With --max-restarts: fewest processes to go on with; otherwise elastic "
                    "mode's fewest (docs/elastic.md).")
@single_option("--restart-delay", type=SECONDS, metavar="SECONDS",
               help="With --max-restarts: wait this long before each restart.")
@horovod_click_options(RUN_OWN_FLAGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, /, hosts: str | None, hostfile: str | None, iface: str | None,
        python: str | None, ssh_port: int | None, ssh_identity_file: str | None,
        ssh_config: str | None, connect_timeout: int, accept_new_host_keys: bool, launcher: str,
        num_proc: int | None, oversubscribe: bool, env_items: tuple[str, ...],
        env_file: str | None, module: str | None, mpi_args: str | None, output_dir: str | None,
        ranks_spec: str | None, local_ranks_spec: str | None, as_json: bool,
        timeout: float | None, tree_spawn: bool, ssh_default_kex: bool, no_check: bool,
        dry_run: bool, verbose: bool, max_restarts: int | None, min_np: int | None,
        restart_delay: float | None,
        args: tuple[str, ...], program: tuple[str, ...] = (), **horovod: Any) -> None:
    """Run a command on every host through mpirun: SCRIPT.py [ARGS], -m MODULE [ARGS],
    python SCRIPT.py [ARGS] or any EXECUTABLE [ARGS] (horovodrun's options work too)."""
    from dtlaunch.run import session

    hvd = read_horovod_flags(horovod)
    for line in hvd.warnings:
        _warn(line)
    if hvd.check_build:
        from dtlaunch.console.run_args import check_build_text

        with signals_raise():
            click.echo(check_build_text(python))
        return
    setup = read_run(ctx, ctx.params, hvd)
    request, policy = setup.request, setup.policy
    if as_json and dry_run:
        raise UsageError("--json reports how a job ended; --dry-run starts none")
    from dtlaunch.console.render import ProgressLine

    progress = ProgressLine(enabled=sys.stderr.isatty() and not dry_run)
    on_event = _event_printer(verbose, progress)
    if dry_run:
        events: list[session.Event] = []
        prepared = session.prepare(request, events.append, dry_run=True)
        if policy is not None:  # what the real run refuses, the dry run refuses too
            from dtlaunch.run.restarts import check_policy

            check_policy(policy, len(prepared.plan.rank_hosts))
        for event in events:
            on_event(event)
        click.echo(prepared.plan.display())
        return
    if setup.output_dir is not None:
        from dtlaunch.run.job_output import earlier_logs

        found = earlier_logs(Path(setup.output_dir))
        if found:
            shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            _note(f"--output-dir {setup.output_dir} has logs from an earlier run ({shown}): "
                  "this run's output is appended after a '--- dtlaunch: ...' line in each")
    launch_request = session.LaunchRequest(
        request, check=not no_check, timeout=timeout, output_dir=setup.output_dir,
        use_cache=not hvd.disable_cache, prefix_timestamp=hvd.prefix_timestamp,
        start_timeout=float(hvd.start_timeout) if hvd.start_timeout is not None else None,
        ranks=setup.ranks, ranks_to_stderr=as_json, restarts=policy,
    )
    with progress:
        ended = session.start(launch_request, on_event)
    if ended.restarts is not None:
        show_restarts_end(ended.restarts, setup.output_dir)
    elif ended.single is not None:
        show_job_end(ended.single, as_json)
    if isinstance(ctx.obj, dict) and ctx.obj.get("program"):
        _leave(ended.exit_code)
    sys.exit(ended.exit_code)


def _leave(code: int) -> NoReturn:
    """End dtlaunch the moment its job has ended and been reported. The job's files are
    closed by then (execute's `finally`) and the console is flushed here; the interpreter's
    own teardown, freeing some 300 modules, would only hold the shell's prompt ~25 ms longer
    for every job. Only when dtlaunch runs as a program (`main()`), never as a library call."""
    for stream in (sys.stdout, sys.stderr):
        # A reader gone (`| head`): nothing is left to write to.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def show_job_end(outcome: RunOutcome, as_json: bool) -> None:
    """The job's report on stderr (root cause first) and, with --json, as data on stdout."""
    from dtlaunch.console.render import job_report_to_dict

    if as_json:
        import json

        click.echo(json.dumps(job_report_to_dict(outcome.report, outcome.exit_code,
                                                 outcome.refused), indent=2))
    if outcome.refused is not None:
        if outcome.preflight is not None:
            from dtlaunch.console.render import render_report

            render_report(outcome.preflight, sys.stderr)
        raise DtlaunchError(outcome.refused.describe())
    if outcome.report is not None:
        _print_job_report(outcome.report)


def show_restarts_end(report: RestartReport, output_dir: str | None) -> None:
    """A --max-restarts job's attempts on stderr and, with --output-dir, as data in
    attempts.json (written whole: a reader never sees half of it)."""
    from dtlaunch.console.render import ATTEMPTS_FILE, restart_report_json, restart_report_lines

    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        target = Path(output_dir) / ATTEMPTS_FILE
        tmp = target.with_name(f".{ATTEMPTS_FILE}.{os.getpid()}")
        tmp.write_text(restart_report_json(report))
        os.replace(tmp, target)
    for line in restart_report_lines(report):
        _note(line)


def _print_job_report(report: Any) -> None:
    from dtlaunch.console.render import job_report_lines

    for text in job_report_lines(report):
        if text.startswith("    "):
            click.echo(text, err=True)  # a rank's own line, as it printed it
        else:
            _note(text)


def read_horovod_flags(params: Mapping[str, Any]) -> HorovodArgs:
    """horovodrun's options among `run`'s parameters, with --config-file read."""
    from dtlaunch.horovod.options import HOROVOD_OPTIONS, read_horovod_args

    names = {o.param for o in HOROVOD_OPTIONS}
    return read_horovod_args({k: v for k, v in params.items() if k in names})


@dataclass(frozen=True)
class RunSetup:
    """`dtlaunch run`'s command line, read and checked as far as it can be without the hosts:
    what the real run, `--dry-run` and `submit` all check the same way."""

    request: RunRequest
    hvd: HorovodArgs
    output_dir: str | None
    policy: RestartPolicy | None  # None without --max-restarts
    ranks: RankFilter | None = None  # --ranks or --local-ranks-filter


def read_run(ctx: click.Context, params: Mapping[str, Any], hvd: HorovodArgs) -> RunSetup:
    """`run`'s parsed parameters (and its horovodrun options, read) to a request; every bad
    value is a UsageError here."""
    from dtlaunch.console.hostfile import read_hosts
    from dtlaunch.console.run_args import RunArgs, build_run_request, resolve_output_dir
    from dtlaunch.job.command import suggest_option
    from dtlaunch.mpijob import launcher_choice
    from dtlaunch.plan.rank_filter import parse_rank_filter
    from dtlaunch.reach.ssh_options import ssh_options_from

    p = params
    known = [o for q in ctx.command.params if isinstance(q, click.Option) and not q.hidden
             for o in q.opts]
    if p["args"]:  # what click left before the program: options it does not know
        raise UsageError(f"run: unknown option {p['args'][0]}"
                         f"{suggest_option(p['args'][0], known)}")
    ranks = None
    if p.get("ranks_spec") is not None and p.get("local_ranks_spec") is not None:
        raise UsageError("--ranks and --local-ranks-filter both pick the ranks shown; give one")
    if p.get("ranks_spec") is not None:
        ranks = parse_rank_filter(p["ranks_spec"])
    elif p.get("local_ranks_spec") is not None:
        ranks = parse_rank_filter(p["local_ranks_spec"], local=True)
    request = build_run_request(RunArgs(
        hosts=read_hosts(p["hosts"], p["hostfile"]),
        python=p["python"],
        default_python=sys.executable,
        ssh=ssh_options_from(p["ssh_port"], p["ssh_identity_file"], p["ssh_config"],
                             p["connect_timeout"], p["accept_new_host_keys"],
                             default_kex=p.get("ssh_default_kex", False)),
        iface=p["iface"],
        num_proc=p["num_proc"],
        oversubscribe=p["oversubscribe"],
        env_items=p["env_items"],
        env_file=p["env_file"],
        module=p["module"],
        mpi_args=p["mpi_args"],
        tree_spawn=p["tree_spawn"],
        rsh_agent=launcher_choice.rsh_agent_command(),
    ), hvd, p.get("program", ()), known)
    request = replace(request, launcher=p["launcher"])
    output_dir = resolve_output_dir(p["output_dir"], hvd)
    max_restarts, min_np, delay = p["max_restarts"], p["min_np"], p["restart_delay"]
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
    policy = None
    if max_restarts is not None:  # the restart policy's module only then (~7 ms to import)
        from dtlaunch.run.restarts import RestartPolicy, check_policy

        policy = check_policy(RestartPolicy(max_restarts, min_np if min_np is not None else 1,
                                            delay or 0.0, p["oversubscribe"]), request.num_proc)
    if p.get("as_json") and policy is not None:
        raise UsageError("--json goes without --max-restarts (the attempts' report is "
                         "--output-dir's attempts.json)")
    return RunSetup(request, hvd, output_dir, policy, ranks)


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


class _TypedArgs(click.Command):
    """A command that takes its words exactly as typed: click's parser would drop the first
    `--`, which `submit` needs to tell sbatch's options from the run command. `-h`/`--help`
    as the first word still shows the help."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args[:1] in (["-h"], ["--help"]):
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()
        ctx.params["args"] = tuple(args)
        ctx.args = []
        return []


@cli.command(cls=_TypedArgs, options_metavar="[SBATCH OPTIONS] [--dry-run] --")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[RUN OPTIONS] COMMAND...")
def submit(args: tuple[str, ...]) -> None:
    """Submit a Slurm batch job that runs dtlaunch run: [SBATCH OPTIONS] [--dry-run] -- [RUN ARGS]."""
    from dtlaunch.cluster.submit import output_path, plan_submit, submit_batch

    plan = plan_submit(args)
    check_submitted_run(plan.run_args, plan.workdir)
    if plan.dry_run:
        click.echo(plan.script, nl=False)
        return
    with signals_raise():
        job = submit_batch(plan)
    where = os.path.join(os.getcwd(), plan.workdir or "")
    click.echo(f"submitted Slurm job {job}; output: {output_path(plan.output, job, where)}")


def check_submitted_run(run_args: Sequence[str], workdir: str | None) -> None:
    """`submit`'s run command, checked here as `run` will check it on the batch node, so a job
    that would only print a usage error is never queued. The hosts are not known yet (they come
    from the allocation): -np is checked against no slot count. A secret's value typed after -x
    is refused: the batch script, which Slurm keeps, and the batch node's command line would
    carry it."""
    from dtlaunch.job.env import looks_secret
    from dtlaunch.job.hosts import Host
    from dtlaunch.mpijob.launcher_choice import family_to_check
    from dtlaunch.plan.plan import plan_run

    ctx = run.make_context("dtlaunch submit [SBATCH OPTIONS] --", list(run_args))
    for item in ctx.params["env_items"]:
        name, sep, _ = item.partition("=")
        if sep and looks_secret(name):
            raise UsageError(
                f"submit: -x {name}=...: a value typed here would be written into the batch "
                "script, which Slurm keeps, and onto the batch node's command line; export "
                f"{name} before submitting and pass -x {name} (the job gets your environment), "
                "or put it in an --env-file")
    here = os.getcwd()
    if workdir is not None:
        if not os.path.isdir(workdir):
            raise UsageError(f"submit: the job's directory {workdir} (--chdir) is not a "
                             "directory here")
        os.chdir(workdir)  # relative paths in the run command are the job's
    try:
        hvd = read_horovod_flags(ctx.params)
        for line in hvd.warnings:
            _warn(line)
        setup = read_run(ctx, ctx.params, hvd)
        family = family_to_check()
        request = setup.request
        if not request.hosts:  # from the allocation: any -np may fit it
            request = replace(request, hosts=(Host("node", 1),), oversubscribe=True)
        plan_run(replace(request, launcher="ssh"), dict(os.environ), family=family)
    finally:
        os.chdir(here)


@cli.command("install-horovod")
@click.option("--force", is_flag=True, help="Rebuild even if a cached wheel exists.")
@single_option("--mpi", metavar="PATH",
               help="The MPI launcher (mpirun/mpiexec) the jobs will use "
                    "(default: the first mpirun or mpiexec on PATH).")
def install_horovod_cmd(force: bool, mpi: str | None) -> None:
    """Build (once) and install Horovod for this PyTorch and the MPI that will run the job."""
    from dtlaunch.horovod.build import install_horovod

    with signals_raise():
        done = install_horovod(force=force, mpi=mpi, say=lambda line: click.echo(line))
        click.echo(f"dtlaunch: {done}")


@cli.command()
@host_options
@single_option("--timeout", type=SECONDS, metavar="SECONDS",
               help="Seconds each host's checks may run once connected (default: 150).")
@single_option("-m", "module", metavar="MODULE", help="Check that MODULE imports on every host.")
@click.option("--pairwise", is_flag=True,
              help="Also check SSH from every host to every other (needed by --tree-spawn).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--gloo", is_flag=True,
              help="Check for a --gloo job: no MPI checks; Horovod must have Gloo.")
@click.argument("script", required=False)
def doctor(hosts: str | None, hostfile: str | None, iface: str | None, python: str | None,
           ssh_port: int | None, ssh_identity_file: str | None, ssh_config: str | None,
           connect_timeout: int, accept_new_host_keys: bool, launcher: str, timeout: float | None,
           module: str | None, pairwise: bool, as_json: bool, gloo: bool,
           script: str | None) -> None:
    """Check every host (and this one) before a job: SSH, Open MPI, Python, Horovod, network."""
    from dtlaunch.console.doctor_args import DoctorArgs, read_doctor
    from dtlaunch.doctor.doctor import run_doctor

    setup = read_doctor(DoctorArgs(
        hosts, hostfile, iface, python, ssh_port, ssh_identity_file, ssh_config, connect_timeout,
        accept_new_host_keys, launcher, timeout, module, pairwise, script, gloo))
    if setup.source and not as_json:
        _note(setup.source)
    request, reach = setup.request, setup.reach
    from dtlaunch.console.render import ProgressLine, preload

    with signals_raise(), ProgressLine(enabled=not as_json and sys.stderr.isatty()) as line:
        report = run_doctor(request, progress=line.hosts_checked,
                            while_waiting=None if as_json else preload, reach=reach)
    if as_json:
        from dtlaunch.console.render import report_to_json

        click.echo(report_to_json(report))
    else:
        from dtlaunch.console.render import render_report

        render_report(report)
    sys.exit(EXIT_OK if report.ok else EXIT_FAILURE)


@cli.command("env-check")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def env_check(as_json: bool) -> None:
    """Report this machine: OS, Python, Open MPI, Horovod, PyTorch, GPUs, network, SSH."""
    from dtlaunch.console.render import env_to_json, render_env
    from dtlaunch.doctor.envcheck import check_env

    with signals_raise():
        report = check_env()
    if as_json:
        click.echo(env_to_json(report))
    else:
        render_env(report)
    sys.exit(EXIT_OK if report.ok else EXIT_FAILURE)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: one line per error, exit 2 for bad input, never a traceback."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="dtlaunch",
                 standalone_mode=False, obj={"program": argv is None})
    except DtlaunchError as exc:
        click.echo(f"dtlaunch: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("dtlaunch: aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        message = exc.format_message().replace("\n", " ")
        click.echo(f"dtlaunch: error: {message}", err=True)
        sys.exit(EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Interrupted as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(EXIT_FAILURE)
