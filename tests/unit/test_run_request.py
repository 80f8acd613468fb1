"""One request, built once: `dtlaunch run`, its `--dry-run`, `dtlaunch submit` and a library
caller all get the same LaunchRequest from the same options (console.run_args.config_from_args),
and `dtlaunch run --help` shows each option once, under the section of its kind.

The requests are caught where each path hands them on (session.start, session.dry_run, submit's
check of the batch node's run); nothing is started. The help is the real program's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
from helpers.suite import dtlaunch_argv

from dtlaunch import cli
from dtlaunch.console import run_args
from dtlaunch.console.options import OTHER, RUN_SECTIONS
from dtlaunch.console.run_args import RunOptions, config_from_args
from dtlaunch.run import session
from dtlaunch.run.request import LaunchRequest

# Where a user should find an option, by kind (a sample of every section).
TORCH = "torch.distributed (--torch, no Horovod; docs/torch.md)"
SECTION_OF = {
    "--hosts": "Hosts and slots", "--hostfile": "Hosts and slots", "--num-proc": "Hosts and slots",
    "--launcher": "Hosts and slots", "-m": "Program and environment",
    "--python": "Program and environment", "--env": "Program and environment",
    "--env-file": "Program and environment", "--ssh-port": "SSH", "--ssh-default-kex": "SSH",
    "--accept-new-host-keys": "SSH", "--iface": "Network", "--network-interface": "Network",
    "--mpi-args": "MPI (or Gloo, no MPI)", "--binding-args": "MPI (or Gloo, no MPI)",
    "--gloo": "MPI (or Gloo, no MPI)", "--no-check": "Pre-flight checks",
    "--disable-cache": "Pre-flight checks", "--start-timeout": "Pre-flight checks",
    "--output-dir": "Output", "--output-filename": "Output", "--ranks": "Output",
    "--json": "Output", "--verbose": "Output", "--prefix-output-with-timestamp": "Output",
    "--timeout": "Time limit, failures and restarts",
    "--max-restarts": "Time limit, failures and restarts",
    "--min-np": "Time limit, failures and restarts",
    "--max-np": "Elastic (Horovod's elastic mode, with --min-np; docs/elastic.md)",
    "--host-discovery-script": "Elastic (Horovod's elastic mode, with --min-np; docs/elastic.md)",
    "--fusion-threshold-mb": "Horovod's knobs (variables for the ranks; docs/horovodrun.md)",
    "--config-file": "Horovod's knobs (variables for the ranks; docs/horovodrun.md)",
    "--log-level": "Horovod's knobs (variables for the ranks; docs/horovodrun.md)",
    "--torch": TORCH, "--nproc-per-node": TORCH, "--local-rank-arg": TORCH,
    "--master-port": TORCH,
    "--dry-run": "Print and exit", "--check-build": "Print and exit", "--help": "Print and exit",
}


def help_sections(text: str) -> dict[str, list[str]]:
    """`--help`'s option rows (their first column) by section heading."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.fullmatch(r"\S.*:", line) and not line.startswith("Usage:"):
            current = line[:-1]
            sections[current] = []
        elif current is not None and line.startswith("  -"):
            sections[current].append(re.split(r"\s{2,}", line.strip())[0])
    return sections


def test_run_help_shows_every_option_once_under_its_section() -> None:
    proc = subprocess.run(dtlaunch_argv("run", "--help"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    sections = help_sections(proc.stdout)
    # Every section with options, in order; none left over.
    assert list(sections) == list(RUN_SECTIONS)
    assert OTHER not in sections and "Options" not in sections
    rows = [row for found in sections.values() for row in found]
    group = click.Context(cli.cli, info_name="dtlaunch", **cli.cli.context_settings)
    ctx = click.Context(cli.run, info_name="run", parent=group)  # -h/--help, as the group says
    visible = [p for p in cli.run.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
    assert len(rows) == len(visible)  # one row per option, no row twice
    for param in visible:
        if "--help" in param.opts:
            # click keeps the help option it made first (another test's context may have made
            # it with --help alone): its row is the group's -h/--help, checked below.
            continue
        record = param.get_help_record(ctx)
        assert record is not None
        assert rows.count(record[0]) == 1, record[0]
    assert rows.count("-h, --help") == 1
    where = {row: title for title, found in sections.items() for row in found}
    for flag, title in SECTION_OF.items():
        [row] = [r for r in where if flag in re.split(r"[ ,]+", r)]
        assert where[row] == title, (flag, where[row])


def test_doctor_help_keeps_its_one_list() -> None:
    proc = subprocess.run(dtlaunch_argv("doctor", "--help"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    assert list(help_sections(proc.stdout)) == ["Options"]


@pytest.fixture
def caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, LaunchRequest]:
    """Each path's LaunchRequest, caught where it is handed on; nothing starts."""
    (tmp_path / "train.py").write_text("print(1)\n")
    monkeypatch.chdir(tmp_path)
    found: dict[str, LaunchRequest] = {}

    def start(request: LaunchRequest, on_event: Any) -> session.JobOutcome:
        found["run"] = request
        return session.JobOutcome(0)

    class Shown:
        def display(self) -> str:
            return "mpirun ..."

    def dry_run(request: LaunchRequest, on_event: Any) -> Shown:
        found["dry-run"] = request
        return Shown()

    def check_batch_run(request: LaunchRequest) -> None:
        found["submit"] = request

    monkeypatch.setattr(session, "start", start)
    monkeypatch.setattr(session, "dry_run", dry_run)
    monkeypatch.setattr(run_args, "check_batch_run", check_batch_run)
    return found


def through_every_path(args: list[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["run", *args])
    assert ended.value.code == 0
    cli.main(["run", "--dry-run", *args])
    cli.main(["submit", "-N", "2", "--dry-run", "--", *args])


RUNS = [
    ["-H", "a:2,b:2", "-np", "4", "-x", "A=1", "-x", "HOME", "--timeout", "30", "--ranks", "0,3",
     "--output-dir", "logs", "train.py", "--lr", "0.1", "-H", "x"],
    ["-H", "a:2,b:2", "--max-restarts", "2", "--min-np", "2", "--restart-delay", "1.5",
     "-v", "train.py"],
    ["-H", "a:2,b:2", "--min-np", "2", "--max-np", "4", "--elastic-timeout", "60", "train.py"],
    ["-H", "a:1", "--fusion-threshold-mb", "32", "--gloo", "--disable-cache", "--start-timeout",
     "40", "--no-check", "--prefix-output-with-timestamp", "-m", "pkg.mod", "x"],
    ["--hosts", "a:2", "-p", "2222", "--connect-timeout", "5", "--ssh-default-kex",
     "--tree-spawn", "--mpi-args", "--bind-to core", "--iface", "10.0.0.0/8",
     "--local-ranks-filter", "0", "--launcher", "ssh", "python", "train.py"],
]


@pytest.mark.parametrize("args", RUNS)
def test_run_dry_run_and_submit_build_one_request(args: list[str],
                                                  caught: dict[str, LaunchRequest]) -> None:
    through_every_path(args)
    assert sorted(caught) == ["dry-run", "run", "submit"]
    assert caught["run"] == caught["dry-run"] == caught["submit"]
    assert caught["run"].run.hosts  # the options were read, not defaults
    assert caught["run"].run.program is not None


def test_the_request_carries_every_option(caught: dict[str, LaunchRequest]) -> None:
    through_every_path(RUNS[0])
    request = caught["run"]
    assert request.timeout == 30 and request.output_dir == "logs" and request.restarts is None
    assert request.ranks is not None and request.run.num_proc == 4
    assert request.run.program is not None
    assert request.run.program.argv[-5:] == ("train.py", "--lr", "0.1", "-H", "x")
    through_every_path(RUNS[1])
    restarts = caught["dry-run"].restarts
    assert restarts is not None and (restarts.max_restarts, restarts.min_np) == (2, 2)
    through_every_path(RUNS[2])
    elastic = caught["submit"].run.elastic
    assert elastic is not None and caught["submit"].run.controller == "gloo"


def test_a_library_caller_builds_the_same_request(caught: dict[str, LaunchRequest]) -> None:
    through_every_path(["-H", "a:2,b:2", "-np", "4", "-x", "A=1", "--max-restarts", "1",
                        "train.py", "--lr", "0.1"])
    mine = config_from_args(RunOptions(hosts="a:2,b:2", num_proc=4, env_items=("A=1",),
                                       max_restarts=1, program=("train.py", "--lr", "0.1")))
    assert mine == caught["run"] == caught["submit"]


@pytest.mark.parametrize(("args", "message"), [
    (["--restart-delay", "1", "train.py"], "--restart-delay goes with --max-restarts N"),
    (["--max-restarts", "1", "--max-np", "4", "train.py"], "resets itself"),
    (["--ranks", "0", "--local-ranks-filter", "0", "train.py"], "give one"),
    (["--bogus-option", "train.py"], "unknown option --bogus-option"),
    (["--iface", "eth0", "--network-interface", "eth1", "train.py"], "name the same thing"),
])
def test_every_path_refuses_the_same_bad_input(args: list[str], message: str,
                                               caught: dict[str, LaunchRequest],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    for words in (["run", "-H", "a:2", *args], ["run", "--dry-run", "-H", "a:2", *args],
                  ["submit", "--", "-H", "a:2", *args]):
        with pytest.raises(SystemExit) as ended:
            cli.main(words)
        assert ended.value.code == 2, words
        assert message in capsys.readouterr().err, words
    with pytest.raises(Exception, match=re.escape(message)):
        ctx = cli.run.make_context("run", ["-H", "a:2", *args])
        config_from_args(RunOptions.from_params(ctx.params), cli.known_options(cli.run))
    assert caught == {}


def test_a_kinds_options_reach_the_request_through_the_registry(
        caught: dict[str, LaunchRequest]) -> None:
    """--torch's options are declared from its KindOptions and read by its refine, on every
    path; a library caller names them in RunOptions.kinds."""
    from dtlaunch.torchrun.options import TorchSpec

    through_every_path(["-H", "a,b", "--torch", "--nproc-per-node", "2", "--master-port", "29600",
                        "train.py"])
    run = caught["run"].run
    assert run.controller == "torch" and run.spec == TorchSpec(2, None, 29600)
    assert [(h.name, h.slots) for h in run.hosts] == [("a", 2), ("b", 2)]
    mine = config_from_args(RunOptions(hosts="a,b", program=("train.py",), kinds={
        "torch": True, "nproc_per_node": "2", "master_port": 29600}))
    assert mine == caught["run"] == caught["submit"]


def test_a_kind_option_nobody_declares_is_refused() -> None:
    from dtlaunch.core.errors import UsageError

    with pytest.raises(UsageError, match="no kind of job has the option bogus"):
        config_from_args(RunOptions(hosts="a", program=("python", "-c", "0"), kinds={"bogus": 1}))


def _help(words: list[str]) -> str:
    proc = subprocess.run(dtlaunch_argv(*words), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_kinds_section_and_doctor_flag_come_from_the_registry() -> None:
    from dtlaunch.jobkind import kind_options

    options = kind_options()
    assert set(options) == {"gloo", "torch"}
    run_help = help_sections(_help(["run", "--help"]))
    for kind in options.values():
        if kind.section:
            assert [o.names[0] for o in kind.run] == [
                row.split(",")[0].split()[0] for row in run_help[kind.section]]
    doctor_help = _help(["doctor", "--help"])
    assert all(k.doctor is not None and k.doctor.names[0] in doctor_help
               for k in options.values())


def test_doctor_takes_one_kind_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["doctor", "--gloo", "--torch", "-H", "a"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "--gloo and --torch check for different kinds of job" in err
    assert len(err.strip().splitlines()) == 1
