"""srun probe lines, srun's labeled output, batch scripts and sbatch's answer. Pure code."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.cluster.slurm import (
    build_batch_script,
    build_srun_probe_argv,
    parse_sbatch_output,
    parse_srun_labeled,
    parse_srun_task_errors,
)
from dtlaunch.core.errors import DtlaunchError, UsageError


def test_srun_probe_argv_one_task_per_node() -> None:
    argv = build_srun_probe_argv(["h1", "h2", "h3"], ["/venv/bin/python", "-m", "dtlaunch.probe.command"])
    assert argv == (
        "srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=h[1-3]",
        "--overlap", "--kill-on-bad-exit=0", "--unbuffered", "--label", "--mpi=none",
        "--job-name=dtlaunch-probe", "--export=PATH",
        "--", "/venv/bin/python", "-m", "dtlaunch.probe.command",
    )


def test_srun_probe_argv_export_list_and_bad_input() -> None:
    argv = build_srun_probe_argv(["gpu-a1", "node07"], ["true"], export=("PATH", "LD_LIBRARY_PATH"),
                                 srun="/opt/slurm/bin/srun")
    assert argv[0] == "/opt/slurm/bin/srun"
    assert "--nodelist=gpu-a1,node07" in argv and "--export=PATH,LD_LIBRARY_PATH" in argv
    assert "--export=NONE" in build_srun_probe_argv(["a"], ["true"], export=())
    with pytest.raises(UsageError, match="no nodes"):
        build_srun_probe_argv([], ["true"])
    with pytest.raises(UsageError, match="empty command"):
        build_srun_probe_argv(["a"], [])
    with pytest.raises(UsageError, match="invalid variable name 'A=B'"):
        build_srun_probe_argv(["a"], ["true"], export=("A=B",))


def test_labeled_output_maps_tasks_to_nodes() -> None:
    # As srun printed it on the test bed (labels padded to the widest task number).
    text = " 8: x\n 0: {\"a\": 1}\n10: y\n 1: two words\n 1: second line\nsrun: warning: z\n 0:\n"
    nodes = [f"n{i}" for i in range(11)]
    out = parse_srun_labeled(text, nodes)
    assert out.by_node["n0"] == '{"a": 1}\n\n'
    assert out.by_node["n1"] == "two words\nsecond line\n"
    assert out.by_node["n8"] == "x\n" and out.by_node["n10"] == "y\n"
    assert out.by_node["n5"] == ""
    assert out.unlabeled == "srun: warning: z\n"


def test_labeled_output_task_beyond_the_nodes_is_unlabeled() -> None:
    out = parse_srun_labeled("0: a\n3: b\n", ["h1", "h2"])
    assert out.by_node == {"h1": "a\n", "h2": ""}
    assert out.unlabeled == "3: b\n"


@given(st.lists(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")),
                                 max_size=30), max_size=5), min_size=1, max_size=12))
def test_labeled_output_round_trip(per_task: list[list[str]]) -> None:
    nodes = [f"h{i}" for i in range(len(per_task))]
    width = len(str(len(per_task) - 1))
    text = "".join(f"{task:>{width}}: {line}\n" for task, lines in enumerate(per_task) for line in lines)
    out = parse_srun_labeled(text, nodes)
    assert out.unlabeled == ""
    assert [out.by_node[n] for n in nodes] == ["".join(f"{ln}\n" for ln in lines) for lines in per_task]


def test_task_errors_from_srun_stderr() -> None:
    # Lines as srun 22.05 printed them on the test bed.
    stderr = ("srun: error: h3: task 2: Killed\n"
              "srun: error: h2: task 1: Exited with exit code 3\n"
              "srun: Force Terminated StepId=2.0\n"
              "srun: error: h4: tasks 4-5: Exited with exit code 4\n")
    assert parse_srun_task_errors(stderr) == {
        "h3": "Killed", "h2": "Exited with exit code 3", "h4": "Exited with exit code 4"}
    assert parse_srun_task_errors("srun: job 4 queued and waiting for resources\n") == {}


def test_batch_script_exact() -> None:
    script = build_batch_script(
        [("-N", "2"), ("-p", "gpu"), ("-t", "00:10:00"), ("--gpus-per-node", "2"),
         ("--job-name", "my job"), ("--exclusive", None)],
        ["/venv/bin/python", "-m", "dtlaunch", "run", "--iface", "ib0", "train.py", "--lr", "0.1"],
    )
    assert script == (
        "#!/bin/bash\n"
        "#SBATCH -N 2\n"
        "#SBATCH -p gpu\n"
        "#SBATCH -t 00:10:00\n"
        "#SBATCH --gpus-per-node=2\n"
        '#SBATCH --job-name="my job"\n'
        "#SBATCH --exclusive\n"
        "\n"
        "exec /venv/bin/python -m dtlaunch run --iface ib0 train.py --lr 0.1\n"
    )


def test_batch_script_quotes_hostile_arguments_and_bash_reads_them_back() -> None:
    hostile = ["train.py", "$(touch /tmp/x)", "a b", "'q'", "`id`", "x;y", "*", "\n", "é"]
    script = build_batch_script([("-N", "1")], ["printf", "%s\\0", *hostile])
    assert script.split("\n\n", 1)[1].startswith("exec printf")
    # The script's run line, run by bash, hands every argument over byte for byte.
    out = subprocess.run(["bash", "-c", script.split("\n\n", 1)[1]], capture_output=True, check=True)
    assert out.stdout.split(b"\0")[:-1] == [a.encode() for a in hostile]
    assert shlex.split(script.split("\n\n", 1)[1])[1:] == ["printf", "%s\\0", *hostile]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([("-N", "2\n#SBATCH --uid=0")], "value '2\\n#SBATCH --uid=0' must be non-empty, on one line"),
        ([("-J", 'a"b')], "must be non-empty, on one line, without quotes"),
        ([("-J", "")], "must be non-empty"),
        ([("N", "2")], "sbatch option 'N': expected -X or --name"),
        ([("--nodes=2", None)], "sbatch option '--nodes=2'"),
        ([("-N 2", None)], "sbatch option '-N 2'"),
    ],
)
def test_batch_script_bad_options(options: list[tuple[str, str | None]], message: str) -> None:
    with pytest.raises(UsageError, match="^" + __import__("re").escape("sbatch option")) as err:
        build_batch_script(options, ["true"])
    assert message in str(err.value)


def test_batch_script_needs_a_command() -> None:
    with pytest.raises(UsageError, match="empty command"):
        build_batch_script([], [])
    with pytest.raises(UsageError, match="NUL"):
        build_batch_script([], ["a\x00b"])


def test_sbatch_output() -> None:
    assert parse_sbatch_output("Submitted batch job 4\n") == "4"
    assert parse_sbatch_output("sbatch: warning: x\nSubmitted batch job 123 on cluster c\n") == "123"
    assert parse_sbatch_output("77\n") == "77"
    assert parse_sbatch_output("77;cluster1\n") == "77"
    with pytest.raises(DtlaunchError, match="sbatch did not report a job id: 'sbatch: error: Batch job submission failed"):
        parse_sbatch_output("sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    with pytest.raises(DtlaunchError):
        parse_sbatch_output("")
