"""The command line's option helpers: single-valued options that catch repeats, seconds that
must be finite, the host options shared by run and doctor, and horovodrun's options generated
from dtlaunch.horovod.options' table. Part of the CLI layer: only it and cli.py import click."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from dtlaunch.core.errors import UsageError
from dtlaunch.job.command import OptionTable, split_program

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
    """A positive, finite number of seconds up to MAX_SECONDS (inf and nan are refused, not
    taken as 'never')."""

    def __init__(self) -> None:
        super().__init__(min=0, min_open=True, max=MAX_SECONDS)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return super().convert(number, param, ctx)


SECONDS = _Seconds()


def single_option(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    kwargs.setdefault("callback", _single)
    return click.option(*decls, multiple=True, **kwargs)


def host_options(func: F) -> F:
    """Options shared by run and doctor: which hosts and how to reach them."""
    decorators = [
        single_option("-H", "--hosts", "hosts", metavar="HOST[:SLOTS],...",
                      help="Hosts and slots, e.g. host1:2,host2:4 (slots default to 1)."),
        single_option("-hostfile", "--hostfile", "hostfile", metavar="FILE",
                      help="Open MPI style hostfile: 'host slots=N' or 'host:N' lines."),
        single_option("--iface", metavar="NAMES|CIDR",
                      help="Network to use: interface names (eth0,ib0) or a subnet (10.0.0.0/24)."),
        single_option("--python", metavar="PATH",
                      help="Interpreter for the ranks (default: the one running dtlaunch)."),
        single_option("-p", "--ssh-port", "ssh_port", type=click.IntRange(1, 65535),
                      help="SSH port on every host."),
        single_option("-i", "--ssh-identity-file", "ssh_identity_file", metavar="FILE",
                      help="SSH private key to use."),
        single_option("--ssh-config", metavar="FILE", help="OpenSSH config file (default ~/.ssh/config)."),
        single_option("--connect-timeout", type=click.IntRange(1, 600), default=(10,),
                      show_default="10", help="Seconds to wait for each SSH connection."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust host keys seen for the first time (changed keys still fail)."),
        single_option("--launcher", type=click.Choice(["auto", "ssh", "slurm"]),
                      default=("auto",), show_default="auto",
                      help="How hosts are reached: ssh, or slurm (srun, inside a Slurm job; "
                      "auto picks it there)."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


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
        return func

    return decorate


# Spellings dtlaunch's own run options take (restarts), so the table's refusals give way.
RUN_OWN_FLAGS = ("--min-np",)


class RunCommand(click.Command):
    """`dtlaunch run`: click reads only the words before the program; the program's words
    (dtlaunch.job.command.split_program) reach the command as `program`, untouched, so an option
    after `-m MODULE` or after the script (`-p`, `-H`, `--`) is the program's, never dtlaunch's.
    What click leaves over (`args`) can only be options it does not know."""

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
