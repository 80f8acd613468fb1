"""`dtlaunch submit`: a batch script that calls `dtlaunch run`, handed to sbatch.

`dtlaunch submit [SBATCH OPTIONS] [--dry-run] -- [RUN OPTIONS] SCRIPT [ARGS]`. Parsing and the
script are pure; `submit_batch` runs sbatch (with a timeout) and is the only side effect.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from dtlaunch.cluster.slurm import build_batch_script, parse_sbatch_output
from dtlaunch.core.errors import DtlaunchError, UsageError

SBATCH_TIMEOUT = 60.0
DEFAULT_OUTPUT = "dtlaunch-%j.out"


@dataclass(frozen=True)
class SubmitPlan:
    run_args: tuple[str, ...]
    dry_run: bool
    output: str  # the job's output file, %j for the job id
    script: str  # the batch script's text
    workdir: str | None = None  # sbatch's --chdir: where the job runs (None: here)


def parse_submit_args(args: Sequence[str]) -> tuple[tuple[tuple[str, str | None], ...],
                                                    tuple[str, ...], bool]:
    """sbatch options (`-N 2`, `-N2`, `--time=10`, `--time 10`, `--exclusive`, or none),
    --dry-run, then `--` and the run part, as typed (the CLI keeps the `--`). A value is a
    next word that does not start with '-'."""
    args = list(args)
    if "--" not in args:
        raise UsageError("submit: put -- between the sbatch options and the run command, "
                         "e.g. dtlaunch submit -N 2 -t 30 -- train.py")
    cut = args.index("--")
    before, run = args[:cut], args[cut + 1:]
    if not run:
        raise UsageError("submit: missing the command after --; e.g. dtlaunch submit -N 2 -- train.py")
    options: list[tuple[str, str | None]] = []
    dry_run = False
    i = 0
    while i < len(before):
        word = before[i]
        i += 1
        if word == "--dry-run":
            dry_run = True
            continue
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
            options.append((name, value))
            continue
        if re.fullmatch(r"-[A-Za-z].+", word):
            options.append((word[:2], word[2:]))
            continue
        if not re.fullmatch(r"-[A-Za-z]|--[A-Za-z][A-Za-z0-9-]*", word):
            raise UsageError(f"submit: {word!r} is not an sbatch option; "
                             "the run command goes after --")
        if i < len(before) and not before[i].startswith("-"):
            options.append((word, before[i]))
            i += 1
        else:
            options.append((word, None))
    return tuple(options), tuple(run), dry_run


def plan_submit(args: Sequence[str], python: str = sys.executable) -> SubmitPlan:
    options, run_args, dry_run = parse_submit_args(args)
    output = next((v for o, v in options if o in ("-o", "--output") and v), None)
    if output is None:
        output = DEFAULT_OUTPUT
        options = (*options, ("--output", output))
    workdir = next((v for o, v in options if o in ("-D", "--chdir") and v), None)
    script = build_batch_script(options, [python, "-m", "dtlaunch", "run", *run_args])
    return SubmitPlan(run_args, dry_run, output, script, workdir)


def output_path(output: str, job_id: str, cwd: str) -> str:
    """The output file sbatch writes: %j is the job id, relative paths are from the cwd."""
    path = output.replace("%j", job_id).replace("%A", job_id)
    return path if os.path.isabs(path) else os.path.join(cwd, path)


def submit_batch(plan: SubmitPlan) -> str:
    """Hand the script to sbatch on its stdin; the job id."""
    try:
        proc = subprocess.run(["sbatch", "--parsable"], input=plan.script, capture_output=True,
                              text=True, timeout=SBATCH_TIMEOUT)
    except FileNotFoundError:
        raise UsageError("sbatch not found on PATH; submit needs Slurm's sbatch") from None
    except subprocess.TimeoutExpired:
        raise DtlaunchError(f"sbatch did not answer within {SBATCH_TIMEOUT:g} s; is slurmctld "
                            "reachable? (try 'sinfo')") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise DtlaunchError(f"sbatch refused the job: {why}")
    return parse_sbatch_output(proc.stdout)
