"""Slurm command lines and output: srun probes, batch scripts, sbatch's answer. Pure code."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import hostlist

from dtlaunch.core.errors import DtlaunchError, UsageError
from dtlaunch.job.env import NAME_RE

# Probes need only PATH to find the interpreter; everything else stays on this machine.
PROBE_EXPORT = ("PATH",)


def build_srun_probe_argv(nodes: Sequence[str], command: Sequence[str], *,
                          export: Sequence[str] = PROBE_EXPORT, job_name: str = "dtlaunch-probe",
                          srun: str = "srun") -> tuple[str, ...]:
    """srun argv that runs `command` once on each of `nodes` inside the current allocation.

    --overlap: a probe may run beside a job step that holds the CPUs; --kill-on-bad-exit=0:
    a failing node must not cut the others' answers short; --label: each line says its task;
    --mpi=none: no PMI set-up for a plain command; --export: names only, values stay in
    srun's environment (never on a command line).
    """
    if not nodes:
        raise UsageError("srun probe: no nodes to probe")
    if not command:
        raise UsageError("srun probe: empty command")
    for name in export:
        if not NAME_RE.match(name):
            raise UsageError(f"srun probe: invalid variable name {name!r}")
    n = len(nodes)
    return (
        srun, f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
        f"--nodelist={hostlist.collect_hostlist(list(nodes))}",
        "--overlap", "--kill-on-bad-exit=0", "--unbuffered", "--label", "--mpi=none",
        f"--job-name={job_name}", f"--export={','.join(export) if export else 'NONE'}",
        "--", *command,
    )


@dataclass(frozen=True)
class LabeledOutput:
    """srun --label output split by node; lines with no task label (srun's own) kept apart."""

    by_node: Mapping[str, str]
    unlabeled: str


_LABEL_RE = re.compile(r"^ *([0-9]+): ?(.*)$")


def parse_srun_labeled(text: str, nodes: Sequence[str]) -> LabeledOutput:
    """Split `N: line` output of a probe built by build_srun_probe_argv.

    Task N ran on nodes[N]: with one task per node Slurm places tasks in the order of its node
    list, the order SLURM_JOB_NODELIST shows. Nodes that printed nothing map to "".
    """
    parts: dict[str, list[str]] = {n: [] for n in nodes}
    other: list[str] = []
    for line in text.splitlines():
        match = _LABEL_RE.match(line)
        task = int(match.group(1)) if match else -1
        if match and task < len(nodes):
            parts[nodes[task]].append(match.group(2))
        else:
            other.append(line)
    by_node = {n: "".join(f"{line}\n" for line in lines) for n, lines in parts.items()}
    return LabeledOutput(by_node, "".join(f"{line}\n" for line in other))


# `srun: error: h2: task 1: Exited with exit code 3`, `srun: error: h3: tasks 1-2: Killed`
_TASK_ERROR_RE = re.compile(r"^srun: error: (\S+): tasks? [0-9,\-\[\]]+: (.+)$")


def parse_srun_task_errors(stderr: str) -> dict[str, str]:
    """Node -> srun's reason its task failed ("Exited with exit code 3"), from srun's stderr."""
    errors: dict[str, str] = {}
    for line in stderr.splitlines():
        match = _TASK_ERROR_RE.match(line.strip())
        if match:
            errors.setdefault(match.group(1), match.group(2))
    return errors


# --- batch scripts ----------------------------------------------------------------------------

_OPTION_RE = re.compile(r"^(-[A-Za-z]|--[A-Za-z][A-Za-z0-9-]*)$")


def _sbatch_line(option: str, value: str | None) -> str:
    if not _OPTION_RE.match(option):
        raise UsageError(f"sbatch option {option!r}: expected -X or --name")
    if value is None:
        return f"#SBATCH {option}"
    if not value or any(c in value for c in '"\\') or any(ord(c) < 32 or ord(c) == 127 for c in value):
        # A newline would end the #SBATCH line and put the rest into the script as a command.
        raise UsageError(f"sbatch option {option}: value {value!r} must be non-empty, on one "
                         "line, without quotes or backslashes")
    if re.search(r"\s", value):
        value = f'"{value}"'  # sbatch's own #SBATCH parser understands double quotes
    return f"#SBATCH {option} {value}" if len(option) == 2 else f"#SBATCH {option}={value}"


def build_batch_script(sbatch_options: Sequence[tuple[str, str | None]], run_argv: Sequence[str]) -> str:
    """A batch script: one #SBATCH line per option, then the run command, exec'd.

    The command is shell-quoted word by word, so arguments reach `dtlaunch run` byte for byte
    and nothing in them is ever run by the shell.
    """
    if not run_argv:
        raise UsageError("batch script: empty command")
    if any("\x00" in arg for arg in run_argv):
        raise UsageError("batch script: an argument contains a NUL byte")
    lines = ["#!/bin/bash", *(_sbatch_line(o, v) for o, v in sbatch_options),
             "", f"exec {shlex.join(run_argv)}", ""]
    return "\n".join(lines)


_SUBMITTED_RE = re.compile(r"^Submitted batch job ([0-9]+)\b", re.MULTILINE)
_PARSABLE_RE = re.compile(r"^([0-9]+)(;\S+)?$")


def parse_sbatch_output(text: str) -> str:
    """Job id from sbatch's answer: `Submitted batch job 42` or, with --parsable, `42[;cluster]`."""
    match = _SUBMITTED_RE.search(text) or _PARSABLE_RE.match(text.strip())
    if match:
        return match.group(1)
    raise DtlaunchError(f"sbatch did not report a job id: {text.strip()[:200]!r}")


_NODE_ADDR = re.compile(r"(?:^|\s)NodeName=(\S+).*?(?:^|\s)NodeAddr=(\S+)")


def node_addresses(nodes: Sequence[str]) -> dict[str, str]:
    """Where Slurm reaches each node (its NodeAddr, from `scontrol show node -o NAMES`): a
    node's name need not resolve on this machine. {} when scontrol cannot tell."""
    import subprocess

    from dtlaunch.core.bounded import run_bounded

    if not nodes:
        return {}
    try:
        status, out = run_bounded(["scontrol", "show", "node", "-o", ",".join(nodes)], 20.0)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if status != 0:
        return {}
    found = map(_NODE_ADDR.search, out.splitlines())
    return {m.group(1): m.group(2) for m in found if m}
