"""Command-line interface: parse flags, call the library, map errors to exit codes.

With console/, the only code that imports click. Heavy modules (paramiko, rich,
torch) are imported inside the commands that need them, so `dtlaunch --help` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import click

from dtlaunch import __version__
from dtlaunch.console.options import (
    SECONDS,
    RunCommand,
    host_options,
    kind_doctor_flags,
    single_option,
)
from dtlaunch.console.run_options import run_options
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
    from dtlaunch.run.restarts import RestartReport
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
        if event.level is EventLevel.DETAIL and not verbose:
            return
        if line is not None:
            line.pause()  # a message: the live line steps aside, the next count redraws it
        if event.level is EventLevel.REPORT:
            if event.report is not None:
                _print_job_report(event.report)
        elif event.level is EventLevel.WARNING:
            _warn(event.text)
        else:
            _note(event.text)

    return show


@cli.command(cls=RunCommand,
             context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@run_options  # in their --help sections (console/run_options.py)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, /, **params: Any) -> None:
    """Run a command on every host through mpirun: SCRIPT.py [ARGS], -m MODULE [ARGS],
    python SCRIPT.py [ARGS] or any EXECUTABLE [ARGS] (horovodrun's options work too)."""
    from dtlaunch.console.run_args import RunOptions, check_build_text, config_from_args, read_horovod
    from dtlaunch.run import session

    options = RunOptions.from_params(params)
    hvd = read_horovod(options)
    for line in hvd.warnings:
        _warn(line)
    if hvd.check_build:
        with signals_raise():
            click.echo(check_build_text(options.python))
        return
    request = config_from_args(options, known_options(ctx.command), hvd)
    if options.dry_run:
        click.echo(session.dry_run(request, _event_printer(options.verbose)).display())
        return
    _note_earlier_logs(request.output_dir)
    from dtlaunch.console.render import ProgressLine

    with ProgressLine(enabled=sys.stderr.isatty()) as progress:
        ended = session.start(request, _event_printer(options.verbose, progress))
    if ended.restarts is not None:
        show_restarts_end(ended.restarts, request.output_dir)
    elif ended.single is not None:
        show_job_end(ended.single, options.as_json)
    if isinstance(ctx.obj, dict) and ctx.obj.get("program"):
        _leave(ended.exit_code)
    sys.exit(ended.exit_code)


def known_options(command: click.Command) -> list[str]:
    """The spellings of a command's options a user may type (for 'did you mean')."""
    return [o for q in command.params if isinstance(q, click.Option) and not q.hidden
            for o in q.opts]


def _note_earlier_logs(output_dir: str | None) -> None:
    if output_dir is None:
        return
    from pathlib import Path  # only --output-dir needs it

    from dtlaunch.run.job_output import earlier_logs

    found = earlier_logs(Path(output_dir))
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        _note(f"--output-dir {output_dir} has logs from an earlier run ({shown}): "
              "this run's output is appended after a '--- dtlaunch: ...' line in each")


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
    from dtlaunch.console.render import job_report_to_dict, render_report

    if as_json:
        import json

        click.echo(json.dumps(job_report_to_dict(outcome.report, outcome.exit_code,
                                                 outcome.refused), indent=2))
    if outcome.refused is not None:
        if outcome.preflight is not None:
            render_report(outcome.preflight, sys.stderr)
        raise DtlaunchError(outcome.refused.describe())
    if outcome.report is not None:
        _print_job_report(outcome.report)


def show_restarts_end(report: RestartReport, output_dir: str | None) -> None:
    """A --max-restarts job's attempts on stderr and, with --output-dir, as data in
    attempts.json (written whole: a reader never sees half of it)."""
    from dtlaunch.console.render import ATTEMPTS_FILE, restart_report_json, restart_report_lines

    if output_dir:
        from pathlib import Path

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
    """`submit`'s run command, read and checked here as `run` will on the batch node (the
    same LaunchRequest), so a job that would only print a usage error is never queued. A
    secret's value typed after -x is refused (console.run_args.refuse_typed_secrets)."""
    from dtlaunch.console.run_args import (
        RunOptions,
        check_batch_run,
        config_from_args,
        read_horovod,
        refuse_typed_secrets,
    )

    ctx = run.make_context("dtlaunch submit [SBATCH OPTIONS] --", list(run_args))
    options = RunOptions.from_params(ctx.params)
    refuse_typed_secrets(options.env_items)
    here = os.getcwd()
    if workdir is not None:
        if not os.path.isdir(workdir):
            raise UsageError(f"submit: the job's directory {workdir} (--chdir) is not a "
                             "directory here")
        os.chdir(workdir)  # relative paths in the run command are the job's
    try:
        hvd = read_horovod(options)
        for line in hvd.warnings:
            _warn(line)
        check_batch_run(config_from_args(options, known_options(run), hvd))
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
@kind_doctor_flags
@click.argument("script", required=False)
def doctor(as_json: bool, **params: Any) -> None:
    """Check every host (and this one) before a job: SSH, Open MPI, Python, Horovod, network."""
    from dtlaunch.console.doctor_args import DoctorArgs, read_doctor
    from dtlaunch.console.render import ProgressLine, preload, render_report, report_to_json
    from dtlaunch.doctor.doctor import run_doctor

    flags = [name for name in params if name.startswith("kind_")]  # kind_doctor_flags
    setup = read_doctor(DoctorArgs(
        **{k: v for k, v in params.items() if k not in flags},
        kinds=tuple(name.removeprefix("kind_") for name in flags if params[name])))
    if setup.source and not as_json:
        _note(setup.source)
    with signals_raise(), ProgressLine(enabled=not as_json and sys.stderr.isatty()) as line:
        report, _ = run_doctor(setup.request, progress=line.hosts_checked,
                            while_waiting=None if as_json else preload, reach=setup.reach)
    if as_json:
        click.echo(report_to_json(report))
    else:
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
