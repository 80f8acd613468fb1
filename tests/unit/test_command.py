"""The command forms of `dtlaunch run`: horovodrun's `python train.py`, any executable, the
`train.py` shorthand and `-m`. Pure rule, checked with exact argv tuples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.core.errors import UsageError
from dtlaunch.job.command import (
    EXECUTABLE,
    MODULE,
    PYTHON,
    SCRIPT,
    Program,
    is_interpreter,
    parse_command,
    python_target,
    suggest_option,
)
from dtlaunch.job.env import plan_environment
from dtlaunch.job.hosts import Host
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import RunPlan, RunRequest, plan_run

VENV = "/venv/bin/python"
FILES = {"train.py", "run.sh", "dir/train.py"}
KNOWN = ("--fusion-threshold-mb", "--fusion-threshold", "--cycle-time-ms", "--hosts", "--iface",
         "--network-interface", "--network-interfaces", "--timeline-filename")


def parse(*words: str, **kw: object) -> Program:
    kw.setdefault("python", VENV)
    return parse_command(words, is_file=FILES.__contains__, known_options=KNOWN, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("words", "expected"), [
    (("train.py", "--lr", "0.1"), Program((VENV, "train.py", "--lr", "0.1"), SCRIPT, VENV, "train.py")),
    (("dir/train.py",), Program((VENV, "dir/train.py"), SCRIPT, VENV, "dir/train.py")),
    (("python", "train.py", "--epochs", "3"),
     Program(("python", "train.py", "--epochs", "3"), PYTHON, "python", "train.py")),
    (("python3", "-u", "-W", "ignore", "train.py"),
     Program(("python3", "-u", "-W", "ignore", "train.py"), PYTHON, "python3", "train.py")),
    (("/opt/env/bin/python3.11", "-m", "pkg.train", "-x"),
     Program(("/opt/env/bin/python3.11", "-m", "pkg.train", "-x"), PYTHON, "/opt/env/bin/python3.11",
             None, "pkg.train")),
    (("python", "-c", "import horovod"), Program(("python", "-c", "import horovod"), PYTHON, "python")),
    (("python", "/only/on/hosts.py"), Program(("python", "/only/on/hosts.py"), PYTHON, "python", "/only/on/hosts.py")),
    (("bash", "run.sh", "a b"), Program(("bash", "run.sh", "a b"), EXECUTABLE)),
    (("./run.sh",), Program(("./run.sh",), EXECUTABLE)),
    (("numactl", "--cpunodebind=0", "python", "train.py"),
     Program(("numactl", "--cpunodebind=0", "python", "train.py"), EXECUTABLE, "python", "train.py")),
    (("nsys", "profile", "-o", "out", "python3", "-m", "pkg"),
     Program(("nsys", "profile", "-o", "out", "python3", "-m", "pkg"), EXECUTABLE, "python3", None, "pkg")),
    (("hostname",), Program(("hostname",), EXECUTABLE)),
])
def test_forms(words: tuple[str, ...], expected: Program) -> None:
    assert parse(*words) == expected


def test_module_form_and_python_option() -> None:
    assert parse("--epochs", "2", module="pkg.train") == Program(
        (VENV, "-m", "pkg.train", "--epochs", "2"), MODULE, VENV, None, "pkg.train")
    assert parse("train.py", python="/other/python", python_given=True).argv == ("/other/python", "train.py")
    # --python names the interpreter the pre-flight checks for an opaque executable.
    assert parse("bash", "run.sh", python="/p/python", python_given=True).python == "/p/python"


@pytest.mark.parametrize(("words", "kw", "message"), [
    ((), {}, "run: missing the command; give one of: SCRIPT.py"),
    (("missing.py",), {}, "run: script not found: missing.py .*python missing.py"),
    (("--fusion-treshold-mb", "3", "train.py"), {}, "unknown option --fusion-treshold-mb; did you mean --fusion-threshold-mb"),
    (("--cycle", "3"), {}, r"unknown option --cycle; did you mean --cycle-time-ms\?"),
    (("--network", "eth0"), {}, r"unknown option --network$"),  # ambiguous prefix: no guess
    (("--bogus=1",), {}, r"unknown option --bogus=1$"),
    (("python", "train.py"), {"python_given": True}, "--python: the command names its interpreter"),
    ((), {"module": "bad-name"}, "not a valid module name"),
])
def test_refused(words: tuple[str, ...], kw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse(*words, **kw)
    assert info.value.exit_code == 2


def test_interpreters() -> None:
    for word in ("python", "python3", "python3.12", "/usr/bin/python3", "pypy3", ".venv/bin/python"):
        assert is_interpreter(word)
    for word in ("pythonx", "ipython", "python-config", "train.py", "bash", "python3.x"):
        assert not is_interpreter(word)


def test_python_target() -> None:
    assert python_target(["-X", "dev", "-OO", "s.py", "-m", "x"]) == ("s.py", None)
    assert python_target(["-mpkg"]) == (None, "pkg")
    assert python_target(["-"]) == (None, None)
    assert python_target(["-u"]) == (None, None)


def test_suggestions() -> None:
    assert suggest_option("--host", KNOWN) == "; did you mean --hosts?"
    assert suggest_option("--zzz", KNOWN) == ""


WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


@given(interpreter=st.sampled_from(["python", "python3", "/x/bin/python3.11"]), rest=st.lists(WORD, max_size=6))
def test_the_python_form_passes_every_word_unchanged(interpreter: str, rest: list[str]) -> None:
    program = parse(interpreter, *rest)
    assert program.argv == (interpreter, *rest) and program.form == PYTHON


@given(first=st.text("abcdefghijklmnopqrstuvwxyz./_-", min_size=1, max_size=10), rest=st.lists(WORD, max_size=4))
def test_every_first_word_has_one_answer(first: str, rest: list[str]) -> None:
    try:
        program = parse(first, *rest)
    except UsageError as exc:
        assert first.startswith("-") or (first.endswith(".py") and first not in FILES), exc
        return
    prefix = (VENV,) if program.form == SCRIPT else ()
    assert program.argv == (*prefix, first, *rest)


def test_plan_runs_the_program_with_dtlaunch_variables() -> None:
    program = parse("bash", "run.sh")
    request = RunRequest(hosts=(Host("h1"), Host("h2")), python=VENV, program=program,
                         extra_env=(("HOROVOD_CYCLE_TIME", "2.5"),), env_items=("HOROVOD_CYCLE_TIME=9",))
    plan = plan_run(request, {"PATH": "/usr/bin"}, family=OPEN_MPI)
    assert plan.argv[-2:] == ("bash", "run.sh")
    assert plan.rank_hosts == ("h1", "h2")
    # -x beats what dtlaunch sets; dtlaunch's variables travel inline.
    assert "HOROVOD_CYCLE_TIME=9" in plan.argv and "HOROVOD_CYCLE_TIME=2.5" not in plan.argv
    only_dtlaunch = plan_run(RunRequest(hosts=(Host("h1"),), python=VENV, program=program,
                                        extra_env=(("HOROVOD_CYCLE_TIME", "2.5"),)), {}, family=OPEN_MPI)
    assert "HOROVOD_CYCLE_TIME=2.5" in only_dtlaunch.argv
    assert plan_environment({}, (), dict(request.extra_env)).names() == ("HOROVOD_CYCLE_TIME",)


# --- a launcher for one machine, chosen by the environment -----------------------------------


@pytest.mark.parametrize("value, left_out", [
    ("isolated", True), ("^rsh", True), ("slurm", True), ("rsh", False), (" ssh ", False)])
def test_an_environment_choosing_a_non_ssh_launcher_is_left_out_across_hosts(
        value: str, left_out: bool) -> None:
    from dtlaunch.openmpi.mca import foreign_plm_choice

    environ = {"OMPI_MCA_plm": value, "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    assert foreign_plm_choice(environ) == (("OMPI_MCA_plm",) if left_out else ())
    request = RunRequest(hosts=(Host("h1"), Host("h2")), python=VENV,
                         program=parse("bash", "run.sh"))
    plan = plan_run(request, environ, family=OPEN_MPI)
    assert ("OMPI_MCA_plm" not in plan.launcher_env) is left_out
    assert plan.left_out_env == ((("OMPI_MCA_plm", value),) if left_out else ())
    # Other MCA settings still reach mpirun.
    assert plan.launcher_env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"


# --- a launcher for one machine, chosen in a parameter file ------------------------------------


def test_a_parameter_files_launcher_choice_is_read_from_its_lines() -> None:
    from dtlaunch.openmpi.mca import plm_choice_in

    text = ("# plm = isolated\nplm = isolated  # an image's default\npls=slurm\n"
            "plm = rsh\nplm_rsh_agent = ssh\n  plm =  ssh \n")
    assert plm_choice_in(text) == ["plm = isolated", "pls = slurm"]


def test_a_parameter_files_launcher_is_overridden_across_hosts_by_each_versions_name() -> None:
    """ORTE (Open MPI 3-4) calls ssh's launcher rsh, PRRTE (5.x) ssh; the command line wins
    over any parameter file. A job here, under Slurm, or with --mpi-args naming a launcher
    keeps its command line."""
    program = parse("bash", "run.sh")
    where = ("/home/me/.prte/mca-params.conf: plm = isolated",)

    def plan(hosts: tuple[Host, ...], version: tuple[int, ...] = (4, 1, 6),
             **kw: object) -> RunPlan:
        request = RunRequest(hosts=hosts, python=VENV, program=program, **kw)  # type: ignore[arg-type]
        return plan_run(request, {}, family=OPEN_MPI, mpi_version=version, launcher_set_in=where)

    def plm(argv: tuple[str, ...]) -> list[str]:
        return [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "plm"]

    across = (Host("h1"), Host("h2"))
    four, five = plan(across), plan(across, (5, 0, 8))
    assert plm(four.argv) == plm(four.launch_argv) == ["rsh"]
    assert plm(five.argv) == ["ssh"]
    assert four.launcher_overridden == five.launcher_overridden == where
    here = plan((Host("localhost", 2),))
    assert plm(here.argv) == [] and here.launcher_overridden == ()
    slurm = plan(across, via="slurm")
    assert plm(slurm.argv) == ["slurm"] and slurm.launcher_overridden == ()
    theirs = plan(across, mpi_args=("--mca", "plm", "rsh"))
    assert plm(theirs.argv) == ["rsh"] and theirs.launcher_overridden == ()
    plain = plan_run(RunRequest(hosts=across, python=VENV, program=program), {},
                     family=OPEN_MPI)
    assert plm(plain.argv) == [] and plain.launcher_overridden == ()


def test_a_one_machine_launcher_is_kept_for_a_job_on_this_machine_and_under_slurm() -> None:
    from dtlaunch.hydra.family import HYDRA

    environ = {"OMPI_MCA_plm": "isolated", "PRTE_MCA_plm": "isolated"}
    program = parse("bash", "run.sh")
    local = plan_run(RunRequest(hosts=(Host("localhost", 2),), python=VENV, program=program),
                     environ, family=OPEN_MPI)
    assert local.left_out_env == () and local.launcher_env["OMPI_MCA_plm"] == "isolated"
    # `--mca plm slurm` on the command line wins over the environment there.
    slurm = plan_run(RunRequest(hosts=(Host("n1"), Host("n2")), python=VENV, program=program,
                                via="slurm"), environ, family=OPEN_MPI)
    assert slurm.left_out_env == ()
    across = plan_run(RunRequest(hosts=(Host("n1"), Host("n2")), python=VENV, program=program),
                      environ, family=OPEN_MPI)
    assert dict(across.left_out_env) == environ
    # Hydra reads no Open MPI variable: nothing is taken from its environment.
    hydra = plan_run(RunRequest(hosts=(Host("n1"), Host("n2")), python=VENV, program=program),
                     environ, family=HYDRA)
    assert hydra.left_out_env == ()
