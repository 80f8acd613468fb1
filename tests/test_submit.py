"""dtlaunch submit's parsing and batch script (pure), and its bad input."""

from __future__ import annotations

import subprocess

import pytest
from conftest import dtlaunch_argv

from dtlaunch.cluster.submit import output_path, parse_submit_args, plan_submit
from dtlaunch.core.errors import UsageError


def test_sbatch_options_then_the_run_command() -> None:
    options, run, dry = parse_submit_args(
        ["-N", "2", "-t30", "--gpus-per-node=4", "-p", "gpu", "--exclusive", "--dry-run", "--",
         "-np", "8", "train.py", "--lr", "0.1"])
    assert options == (("-N", "2"), ("-t", "30"), ("--gpus-per-node", "4"), ("-p", "gpu"),
                       ("--exclusive", None))
    assert run == ("-np", "8", "train.py", "--lr", "0.1") and dry


def test_plan_adds_an_output_file_and_calls_dtlaunch_run() -> None:
    plan = plan_submit(["-N", "2", "--", "train.py", "a b"], python="/opt/py")
    assert "#SBATCH --output=dtlaunch-%j.out" in plan.script
    assert plan.script.rstrip().endswith("exec /opt/py -m dtlaunch run train.py 'a b'")
    given = plan_submit(["-o", "/x/out-%j.log", "--", "train.py"], python="/opt/py")
    assert given.output == "/x/out-%j.log" and "--output=dtlaunch" not in given.script
    assert output_path(given.output, "42", "/home") == "/x/out-42.log"
    assert output_path("o-%j.txt", "7", "/home") == "/home/o-7.txt"


@pytest.mark.parametrize(("args", "message"), [
    (["-N", "2", "train.py"], "put -- between"),
    (["-N", "2", "--"], "missing the command"),
    (["bad", "-N", "2", "--", "x.py"], "'bad' is not an sbatch option"),
    (["--job-name", "a\"b", "--", "x.py"], "without quotes"),
])
def test_bad_submit_input(args: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        plan_submit(args)


def test_dry_run_prints_the_script_and_submits_nothing() -> None:
    proc = subprocess.run(dtlaunch_argv("submit", "-N", "2", "--dry-run", "--", "train.py"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n#SBATCH -N 2\n")
    bad = subprocess.run(dtlaunch_argv("submit", "-N", "2", "train.py"), capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "put -- between" in bad.stderr
