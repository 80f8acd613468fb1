"""The command line's option helpers: single-valued options that catch repeats, seconds that
must be finite, the host options shared by run and doctor, horovodrun's options generated
from dtlaunch.horovod.options' table, and run's --help in sections (`option_group`). Part of
the CLI layer: only it and cli.py import click."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dtlaunch.core.errors import UsageError
from dtlaunch.job.command import OptionTable, split_program
from dtlaunch.jobkind import KindOption, kind_options

if TYPE_CHECKING:
    from dtlaunch.horovod.options import HorovodOption

F = TypeVar("F", bound=Callable[..., Any])


def _single(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Options that take one value are declared `multiple` so a repeat is caught, not ignored."""
    if isinstance(value, tuple):
        if len(value) > 1:
            raise UsageError(f"{param.opts[-1] if param.opts else param.name}: given more than once")
        return value[0] if value else None
    return value


# A year and a day: longer is a typo, and waits beyond the platform's time_t overflow.
MAX_SECONDS = 366 * 86400


class _Seconds(click.FloatRange):
    """Seconds within a range, finite: inf and nan are refused, not taken as 'never'."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return super().convert(number, param, ctx)


SECONDS = _Seconds(min=0, min_open=True, max=MAX_SECONDS)  # positive, up to MAX_SECONDS


def single_option(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    kwargs.setdefault("callback", _single)
    return click.option(*decls, multiple=True, **kwargs)


# The options run and doctor share (which hosts, how to reach them), by parameter name, in
# doctor's order; each use declares a new click.Option (click.option makes one per command).
HOST_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "hosts": single_option("-H", "--hosts", "hosts", metavar="HOST[:SLOTS],...",
                           help="Hosts and slots, e.g. host1:2,host2:4 (slots default to 1)."),
    "hostfile": single_option("-hostfile", "--hostfile", "hostfile", metavar="FILE",
                              help="Open MPI style hostfile: 'host slots=N' or 'host:N' lines."),
    "iface": single_option("--iface", metavar="NAMES|CIDR",
                           help="Network to use: interface names (eth0,ib0) or a subnet "
                                "(10.0.0.0/24)."),
    "python": single_option("--python", metavar="PATH",
                            help="Interpreter for the ranks (default: the one running dtlaunch)."),
    "ssh_port": single_option("-p", "--ssh-port", "ssh_port", type=click.IntRange(1, 65535),
                              help="SSH port on every host."),
    "ssh_identity_file": single_option("-i", "--ssh-identity-file", "ssh_identity_file",
                                       metavar="FILE", help="SSH private key to use."),
    "ssh_config": single_option("--ssh-config", metavar="FILE",
                                help="OpenSSH config file (default ~/.ssh/config)."),
    "connect_timeout": single_option("--connect-timeout", type=click.IntRange(1, 600),
                                     default=(10,), show_default="10",
                                     help="Seconds to wait for each SSH connection."),
    "accept_new_host_keys": click.option(
        "--accept-new-host-keys", is_flag=True,
        help="Trust host keys seen for the first time (changed keys still fail)."),
    # --launcher's value is kept as `via` (how the hosts are reached); "launcher" is the
    # MPI program's name inside dtlaunch.
    "via": single_option("--launcher", "via", type=click.Choice(["auto", "ssh", "slurm"]),
                         default=("auto",), show_default="auto",
                         help="How the hosts are reached: ssh, or slurm's srun (inside a "
                              "Slurm job; auto picks it there)."),
}


def host_options(func: F) -> F:
    for decorator in reversed(HOST_OPTIONS.values()):
        func = decorator(func)
    return func


# `dtlaunch run --help`'s sections, in the order shown: click-option-group's idea in plain click.
# Each of run's options is declared inside its section's `option_group`; horovodrun's generated
# ones are placed by `horovod_section`. A section without options is not shown.
HOSTS = "Hosts and slots"
PROGRAM = "Program and environment"
SSH = "SSH"
NETWORK = "Network"
MPI = "MPI (or Gloo, no MPI)"
CHECKS = "Pre-flight checks"
OUTPUT = "Output"
RESTARTS = "Time limit, failures and restarts"
ELASTIC = "Elastic (Horovod's elastic mode, with --min-np; docs/elastic.md)"
KNOBS = "Horovod's knobs (variables for the ranks; docs/horovodrun.md)"
EXIT = "Print and exit"
OTHER = "Other options"  # an option declared without a section (a test keeps it empty)
# Each job kind's section (its KindOptions) comes after Elastic, in the registry's order.
RUN_SECTIONS = (HOSTS, PROGRAM, SSH, NETWORK, MPI, CHECKS, OUTPUT, RESTARTS, ELASTIC,
                *(k.section for k in kind_options().values() if k.section), KNOBS, EXIT)
# The attribute a click parameter's section is kept in (click.Option has no field for it).
_SECTION = "dtlaunch_section"


def _declared(func: Callable[..., Any]) -> list[click.Parameter]:
    """The parameters click's decorators have put on `func` so far (its `__click_params__`)."""
    return list(getattr(func, "__click_params__", ()))


def option_group(title: str, *options: Callable[[F], F]) -> Callable[[F], F]:
    """Declare `options` (click option decorators, in the order shown) under the help section
    `title`; what they parse is unchanged."""

    def decorate(func: F) -> F:
        before = len(_declared(func))
        for option in reversed(options):
            func = option(func)
        for param in _declared(func)[before:]:
            setattr(param, _SECTION, title)
        return func

    return decorate


def kind_click_option(option: KindOption) -> Callable[[F], F]:
    if option.type is None:
        return click.option(*option.names, option.param, is_flag=True, help=option.help)
    return single_option(*option.names, option.param, type=option.type, metavar=option.metavar,
                         help=option.help)


def kind_option_groups() -> list[Callable[[F], F]]:
    """Each job kind's own `dtlaunch run` options, in the kind's section."""
    return [option_group(k.section, *map(kind_click_option, k.run))
            for k in kind_options().values() if k.run]


def kind_doctor_flags(func: F) -> F:
    """`dtlaunch doctor`'s flag of each job kind that has one (--gloo, --torch): check the
    hosts for that kind of job."""
    for name, k in reversed(kind_options().items()):
        if k.doctor is not None:
            func = click.option(*k.doctor.names, f"kind_{name}", is_flag=True,
                                help=k.doctor.help)(func)
    return func


def horovod_section(option: HorovodOption) -> str:
    """The help section of one of horovodrun's options: a knob's, else by what it changes."""
    from dtlaunch.horovod.options import ELASTIC_DESTS, SETTING

    if option.kind == SETTING or option.dest is None:
        return KNOBS
    if option.dest in ELASTIC_DESTS:
        return ELASTIC
    return {"network_interfaces": NETWORK, "output_filename": OUTPUT, "prefix_timestamp": OUTPUT,
            "check_build": EXIT, "disable_cache": CHECKS, "start_timeout": CHECKS,
            "config_file": KNOBS, "binding_args": MPI, "gloo": MPI}.get(option.dest, OTHER)


def horovod_click_options(exclude_flags: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Declare horovodrun's options (dtlaunch.horovod.options' table) on a click command.

    Each is `multiple` so a repeat reaches the table's parser, which refuses it."""
    from dtlaunch.horovod.options import horovod_options
    from dtlaunch.horovod.settings import BOOL, FLOAT, INT

    def decorate(func: F) -> F:
        for option in reversed(horovod_options(exclude_flags)):
            common: dict[str, Any] = {"multiple": True, "hidden": option.hidden,
                                      "help": option.help or None}
            if option.value == BOOL:
                func = click.option(*option.flags, option.param, is_flag=True, **common)(func)
            else:
                kind = {INT: int, FLOAT: float}.get(option.value, str)
                func = click.option(*option.flags, option.param, type=kind, nargs=option.nargs,
                                    metavar=option.metavar or None, **common)(func)
            setattr(_declared(func)[-1], _SECTION, horovod_section(option))
        return func

    return decorate


# Spellings dtlaunch's own run options take (restarts), so the table's refusals give way.
RUN_OWN_FLAGS = ("--min-np",)


class RunCommand(click.Command):
    """`dtlaunch run`: click reads only the words before the program; the program's words
    (dtlaunch.job.command.split_program) reach the command as `program`, untouched, so an option
    after `-m MODULE` or after the script (`-p`, `-H`, `--`) is the program's, never dtlaunch's.
    What click leaves over (`args`) can only be options it does not know. Its --help shows the
    options under their sections' headings (`option_group`), in RUN_SECTIONS' order; -h/--help
    itself is shown under EXIT."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {title: [] for title in RUN_SECTIONS}
        help_names = set(self.get_help_option_names(ctx))
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or not isinstance(param, click.Option):
                continue
            title = EXIT if set(param.opts) <= help_names else getattr(param, _SECTION, OTHER)
            rows.setdefault(title, []).append(record)
        for title, found in rows.items():
            if found:
                with formatter.section(title):
                    formatter.write_dl(found)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        short: dict[str, int] = {}
        long: dict[str, int] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                takes = 0 if param.is_flag or param.count else param.nargs
                for spelling in (*param.opts, *param.secondary_opts):
                    one_letter = len(spelling) == 2 and spelling[1] != "-"
                    (short if one_letter else long)[spelling] = takes
        own, program = split_program(args, OptionTable(short, long, program_follows=("-m",)))
        rest = super().parse_args(ctx, list(own))
        ctx.params["program"] = program
        return rest
