"""`dtlaunch run`'s parsed options to a RunRequest: horovodrun's spellings folded into dtlaunch's
own options, the command read as horovodrun reads it, `--env-file` merged with `-x`.

The CLI (the only module with click) hands over plain values; the only I/O here is reading the
files the user named (`--env-file`, `--config-file`) and asking whether a script exists.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass

from dtlaunch.core.errors import DtlaunchError, UsageError
from dtlaunch.horovod.options import HorovodArgs
from dtlaunch.job.command import parse_command
from dtlaunch.job.env import merge_env_items, read_env_file
from dtlaunch.job.hosts import Host
from dtlaunch.mpi import Interfaces, parse_iface, split_mpi_args
from dtlaunch.plan.plan import RunRequest
from dtlaunch.reach.ssh_options import SshOptions


@dataclass(frozen=True)
class RunArgs:
    """What `dtlaunch run` was asked, before the command is read."""

    hosts: tuple[Host, ...]
    python: str | None  # --python; None: the interpreter running dtlaunch
    default_python: str
    ssh: SshOptions
    iface: str | None = None
    num_proc: int | None = None
    oversubscribe: bool = False
    env_items: tuple[str, ...] = ()
    env_file: str | None = None
    module: str | None = None
    mpi_args: str | None = None
    output_dir: str | None = None
    tree_spawn: bool = False
    rsh_agent: str | None = None


def resolve_iface(iface: str | None, hvd: HorovodArgs) -> Interfaces | None:
    """--iface, or horovodrun's --network-interface(s) (the same thing: give one)."""
    if iface is not None and hvd.network_interfaces:
        raise UsageError("--iface and --network-interface(s) name the same thing; give one")
    if hvd.network_interfaces:
        return parse_iface(",".join(hvd.network_interfaces))
    return parse_iface(iface) if iface is not None else None


def resolve_output_dir(output_dir: str | None, hvd: HorovodArgs) -> str | None:
    """--output-dir (or horovodrun's --output-filename), checked before anything runs."""
    if output_dir is not None and hvd.output_filename is not None:
        raise UsageError("--output-dir and --output-filename name the same thing; give one")
    chosen = output_dir if output_dir is not None else hvd.output_filename
    if chosen is not None:
        check_output_dir(chosen, "--output-dir" if output_dir is not None else "--output-filename")
    return chosen


def check_output_dir(path: str, option: str = "--output-dir") -> None:
    """A directory, or a path where one can be made: found now, not after the pre-flight."""
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


def build_run_request(run: RunArgs, hvd: HorovodArgs, words: tuple[str, ...],
                      known_options: Collection[str]) -> RunRequest:
    if run.python is not None and not (os.path.isabs(run.python) or shutil.which(run.python)):
        raise UsageError(f"--python: {run.python} is not an absolute path or a command on PATH")
    interpreter = run.python or run.default_python
    program = parse_command(words, python=interpreter, module=run.module,
                            python_given=run.python is not None, is_file=os.path.isfile,
                            known_options=known_options)
    # With this environment, a bare NAME the file names but nobody set is refused with the
    # file's name and line (not as -x's --env).
    from_file = read_env_file(run.env_file, os.environ) if run.env_file is not None else ()
    return RunRequest(
        hosts=run.hosts,
        python=interpreter,
        script=program.script,
        module=program.module,
        num_proc=run.num_proc,
        oversubscribe=run.oversubscribe,
        iface=resolve_iface(run.iface, hvd),
        env_items=merge_env_items(from_file, run.env_items),
        ssh=run.ssh,
        mpi_args=split_mpi_args(run.mpi_args) if run.mpi_args else (),
        tree_spawn=run.tree_spawn,
        rsh_agent=run.rsh_agent,
        program=program,
        extra_env=hvd.env,
        binding=hvd.binding_args,
        typed_env=tuple(i.partition("=")[0] for i in run.env_items if "=" in i),
        controller=hvd.controller,
    )


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
