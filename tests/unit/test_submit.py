"""dtlaunch submit's parsing and batch script (pure), and its bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.suite import dtlaunch_argv

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


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    proc = subprocess.run(dtlaunch_argv("submit", "-N", "2", "--dry-run", "--", "train.py"),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n#SBATCH -N 2\n")
    bad = subprocess.run(dtlaunch_argv("submit", "-N", "2", "train.py"), capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "put -- between" in bad.stderr


@pytest.mark.parametrize("before", [
    ["-N2"], ["--time=10"], ["--gpus-per-node=4"], ["--exclusive"], [], ["-N", "2", "-t30"],
])
def test_the_readme_forms_keep_their_double_dash(before: list[str], tmp_path: Path) -> None:
    """click's parser drops the first `--`; submit takes its words as typed (issue 27)."""
    (tmp_path / "train.py").write_text("print(1)\n")
    proc = subprocess.run(dtlaunch_argv("submit", "--dry-run", *before, "--", "-np", "2",
                                        "train.py"),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith(" -m dtlaunch run -np 2 train.py")
    assert "#SBATCH --output=dtlaunch-%j.out" in proc.stdout


def test_submit_help_is_still_help() -> None:
    proc = subprocess.run(dtlaunch_argv("submit", "--help"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "sbatch" in proc.stdout.lower()


BAD_RUN_PARTS = [
    (["-np", "0", "train.py"], "-np: must be at least 1"),
    (["-H", "n1:1", "-np", "2", "train.py"], "-np: 2 processes but the hosts have only 1 slots"),
    (["--bogus-option", "train.py"], "unknown option --bogus-option"),
    (["missing.py"], "script not found: missing.py"),
    (["--env-file", "{tmp}", "train.py"], "is a directory"),
    (["--timeout", "-1", "train.py"], "--timeout"),
    (["-x", "1BAD", "train.py"], "invalid variable name '1BAD'"),
    (["--max-restarts", "-1", "train.py"], "--max-restarts: must be between 0"),
    (["--fusion-threshold-mb", "99999999999999999999", "train.py"], "must be at most"),
    (["-x", "AWS_SECRET_ACCESS_KEY=hunter2-value", "train.py"],
     "export AWS_SECRET_ACCESS_KEY before submitting and pass -x AWS_SECRET_ACCESS_KEY"),
    (["--env=DB_PASSWORD=hunter2-value", "train.py"], "or put it in an --env-file"),
    # issue 26: the console filter and --json are checked too
    (["--ranks", "0-x", "train.py"], "--ranks '0-x': '0-x' is not a rank"),
    (["--json", "--max-restarts", "1", "train.py"], "--json goes without --max-restarts"),
]


@pytest.mark.parametrize(("run_part", "message"), BAD_RUN_PARTS)
def test_submit_checks_the_run_command_as_run_would(run_part: list[str], message: str,
                                                    tmp_path: Path) -> None:
    """What `run` would refuse on the batch node is refused before anything is queued, and
    a secret's value typed after -x is neither queued nor echoed."""
    (tmp_path / "train.py").write_text("print(1)\n")
    words = [w.format(tmp=tmp_path) for w in run_part]
    for dry in (["--dry-run"], []):  # without --dry-run: refused before sbatch is looked for
        proc = subprocess.run(dtlaunch_argv("submit", *dry, "-N", "1", "--", *words),
                              capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env={**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
        assert "hunter2" not in proc.stderr


def test_a_secret_taken_from_the_environment_is_fine(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    proc = subprocess.run(dtlaunch_argv("submit", "--dry-run", "--", "-x", "AWS_SECRET_ACCESS_KEY",
                                        "train.py"),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "AWS_SECRET_ACCESS_KEY": "hunter2-value"})
    assert proc.returncode == 0, proc.stderr
    assert "hunter2" not in proc.stdout + proc.stderr
