"""Everything after the program is the program's: `dtlaunch run`'s options end where the program
begins, for every command form (SCRIPT.py, -m MODULE, python ..., an executable).

The pure part runs the CLI's own parser (click, through dtlaunch.console.options.RunCommand), the
command rule and the plan, and decodes the word the rank shim receives; one real local run shows
the tail arrives in the program's sys.argv byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.suite import dtlaunch_argv
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.agents.rank_shim import decode_argv
from dtlaunch.cli import run
from dtlaunch.core.errors import UsageError
from dtlaunch.job.command import OptionTable, parse_command, split_program
from dtlaunch.job.hosts import Host
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import RunRequest, plan_run

VENV = "/venv/bin/python"
# Words that dtlaunch, horovodrun, mpirun or a shell would read as syntax.
LOOKALIKES = ["--", ":", "-p", "-H", "-np", "-m", "-x", "-i", "-v", "-h", "--help", "--hosts",
              "--hosts=h9", "-p=22", "-Hh9", "-np=4", "--dry-run", "--no-check", "--mpi-args",
              "--config-file", "--fusion-threshold-mb", "--gloo", "--unknown", "-", "", " ",
              "a b", "$(touch x)", "`id`", ";", "'", '"', "\n", "\\", "-vm", "-mx", "é", "\udcff"]
WORD = st.one_of(st.sampled_from(LOOKALIKES),
                 st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                         max_size=6))
TAIL = st.lists(WORD, max_size=8)
# The command forms of the README, each with the words the ranks run before the tail.
FORMS: list[tuple[list[str], list[str]]] = [
    (["-m", "pkg.train"], [VENV, "-m", "pkg.train"]),
    (["-mpkg.train"], [VENV, "-m", "pkg.train"]),
    (["train.py"], [VENV, "train.py"]),
    (["python", "train.py"], ["python", "train.py"]),
    (["python"], ["python"]),
    (["bash", "run.sh"], ["bash", "run.sh"]),
    (["numactl", "--interleave=all"], ["numactl", "--interleave=all"]),
    (["--", "train.py"], [VENV, "train.py"]),
]


def parse_cli(argv: Sequence[str]) -> dict[str, Any]:
    """`dtlaunch run ARGV`'s parameters as the CLI's parser gives them to the command."""
    ctx = run.make_context("run", list(argv))
    return dict(ctx.params)


def ranks_argv(argv: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """What the ranks run for `dtlaunch run ARGV`: the argv inside the rank shim's word, and
    the program as the --dry-run line shows it."""
    params = parse_cli(argv)
    assert params["args"] == ()  # nothing left over for dtlaunch to refuse
    program = parse_command(params["program"], python=VENV, module=params["module"],
                            is_file=lambda path: True)
    plan = plan_run(RunRequest(hosts=(Host("h1", 1),), python=VENV, program=program), {}, family=OPEN_MPI)
    return decode_argv(plan.launch_argv[-1]), plan.argv[-len(program.argv):]


@given(tail=TAIL, form=st.sampled_from(FORMS))
def test_the_ranks_receive_exactly_the_tail(tail: list[str], form: tuple[list[str], list[str]]) -> None:
    words, runs = form
    argv = ["-H", "h1:1", "-np", "1", "-x", "A=1", *words, *tail]
    shim, shown = ranks_argv(argv)
    assert shim == [*runs, *tail]
    assert list(shown) == [*runs, *tail]


@given(tail=TAIL)
def test_options_before_the_program_stay_dtlaunchs(tail: list[str]) -> None:
    params = parse_cli(["-p", "2222", "-vH", "h1:2", "--mpi-args=-x B", "-m", "pkg", *tail])
    assert params["ssh_port"] == 2222 and params["verbose"] and params["hosts"] == "h1:2"
    assert params["mpi_args"] == "-x B" and params["module"] == "pkg"
    assert params["program"] == tuple(tail)


def test_the_issues_line() -> None:
    shim, _ = ranks_argv(["-H", "h1:1,h2:1", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "test_torch.py"])
    assert shim == [VENV, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_torch.py"]


TABLE = OptionTable(short={"-H": 1, "-p": 1, "-m": 1, "-v": 0, "-x": 1},
                    long={"--hosts": 1, "-np": 1, "--dry-run": 0, "--pair": 2},
                    program_follows=("-m",))


@pytest.mark.parametrize(("words", "own", "program"), [
    (["-H", "h", "t.py", "-p", "1"], ["-H", "h"], ["t.py", "-p", "1"]),
    (["-m", "mod", "-H", "h"], ["-m", "mod"], ["-H", "h"]),
    (["-mmod", "-v"], ["-mmod"], ["-v"]),
    (["-vm", "mod", "x"], ["-vm", "mod"], ["x"]),
    (["-vmmod", "x"], ["-vmmod"], ["x"]),
    (["-x", "-m", "t.py"], ["-x", "-m"], ["t.py"]),  # -x's value, not -m
    (["--hosts=-m", "t.py"], ["--hosts=-m"], ["t.py"]),
    (["--pair", "a", "b", "t.py"], ["--pair", "a", "b"], ["t.py"]),
    (["-np", "2", "--", "-H"], ["-np", "2"], ["-H"]),
    (["--unknown", "t.py", "--"], ["--unknown"], ["t.py", "--"]),
    (["-q", "-H", "h", "t.py"], ["-q", "-H", "h"], ["t.py"]),
    (["-", "x"], [], ["-", "x"]),
    (["-H"], ["-H"], []),
    (["-m"], ["-m"], []),
])
def test_split_program(words: list[str], own: list[str], program: list[str]) -> None:
    assert split_program(words, TABLE) == (tuple(own), tuple(program))


@pytest.mark.parametrize(("argv", "message"), [
    (["--foo", "-m", "pkg", "-q"], "unknown option --foo"),
    (["-q", "train.py"], "unknown option -q"),
    (["--fusion-treshold-mb", "3", "python", "t.py"], "did you mean --fusion-threshold-mb"),
])
def test_unknown_options_before_the_program_are_refused(argv: list[str], message: str) -> None:
    result = subprocess.run(dtlaunch_argv("run", "--dry-run", "-H", "h1", *argv),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("dtlaunch: error: run: unknown option ")
    assert result.stderr.count("\n") == 1 and message in result.stderr


# A module that writes the arguments it got, as bytes, to the file named by TAIL_OUT.
ECHO_MODULE = """\
import json, os, sys
with open(os.environ["TAIL_OUT"], "w") as out:
    json.dump([os.fsencode(a).hex() for a in sys.argv[1:]], out)
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
@pytest.mark.parametrize("form", ["module", "script", "python"])
def test_a_real_run_passes_the_tail_byte_for_byte(tmp_path: Path, form: str) -> None:
    (tmp_path / "tailecho.py").write_text(ECHO_MODULE)
    out = tmp_path / "tail.json"
    tail = [b"-q", b"-p", b"no:cacheprovider", b"-H", b"h9:4", b"-np", b"3", b"--", b":",
            b"--dry-run", b"a b", b"$(touch pwned)", b"\n", b"", "é".encode(), b"\xff\xfe"]
    program = {"module": [b"-m", b"tailecho"], "script": [b"tailecho.py"],
               "python": [os.fsencode(sys.executable), b"tailecho.py"]}[form]
    env = {**os.environ, "TAIL_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    argv = [os.fsencode(a) for a in dtlaunch_argv("run", "--no-check", "-np", "1",
                                                  "-x", "TAIL_OUT")] + program + tail
    result = subprocess.run(argv, capture_output=True, cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert [bytes.fromhex(a) for a in json.loads(out.read_text())] == tail
    assert not (tmp_path / "pwned").exists()


def test_a_refused_program_word_is_not_an_option() -> None:
    # After `--`, `-m` is a program word, and no program starts with an option.
    with pytest.raises(UsageError, match="unknown option -m"):
        parse_command(split_program(["--", "-m", "x"], TABLE)[1], python=VENV)
