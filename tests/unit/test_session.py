"""The library entry point for a run: events and outcome come back, nothing is printed."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from dtlaunch.agents.rank_shim import encode_argv
from dtlaunch.console.render import job_report_lines
from dtlaunch.core.errors import UsageError
from dtlaunch.core.failure import Failure
from dtlaunch.job.hosts import Host
from dtlaunch.plan.plan import RunRequest
from dtlaunch.run import session
from dtlaunch.run.execute import LaunchResult
from dtlaunch.run.failure_report import build_report

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")


@pytest.fixture(autouse=True)
def _no_kept_home_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's training variables would add a kept-home note to every run's events."""
    import os

    from dtlaunch.job.env import EnvPlan, kept_home

    for name in kept_home(os.environ, EnvPlan(())):
        monkeypatch.delenv(name)



def request(tmp_path: Path, **kw: Any) -> RunRequest:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    base: dict[str, Any] = dict(hosts=(Host("h1"), Host("h2")), python=sys.executable,
                                script=str(script), env_items=("MY_TOKEN",))
    base.update(kw)
    return RunRequest(**base)


class FakeExecutor:
    def __init__(self, result: LaunchResult) -> None:
        self.result = result
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, argv: Any, env: Any, rank_hosts: Any, **kw: Any) -> LaunchResult:
        self.calls.append((tuple(argv), dict(env), tuple(rank_hosts), kw))
        kw["announce"]("starting")
        return self.result


@needs_mpirun
def test_launch_without_checks_returns_the_outcome_and_prints_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOKEN", "s3cr3t")
    events: list[session.Event] = []
    failed = LaunchResult(3, Failure(rank=1, host="h2", exit_code=3))
    fake = FakeExecutor(failed)
    outcome = session.launch(session.LaunchRequest(request(tmp_path), check=False, timeout=5),
                             events.append, executor=fake)
    assert capsys.readouterr() == ("", "")
    assert outcome.exit_code == 3 and outcome.result is failed and outcome.preflight is None
    argv, env, rank_hosts, kw = fake.calls[0]
    assert argv[0] == shutil.which("mpirun") and argv[1:] == outcome.plan.launch_argv[1:]
    assert argv[-1] == encode_argv(outcome.plan.argv[-2:])  # the ranks start through the shim
    assert rank_hosts == ("h1", "h2") and kw["timeout"] == 5 and kw["stop_when"] is None
    assert env["MY_TOKEN"] == "s3cr3t" and "s3cr3t" not in " ".join(argv)
    levels = [(e.level, e.text.split(",")[0].split(":")[0]) for e in events]
    assert levels == [(session.EventLevel.WARNING, "exporting MY_TOKEN"),
                      (session.EventLevel.DETAIL, "running"),
                      (session.EventLevel.NOTE, "starting")]
    assert outcome.report is not None
    assert job_report_lines(outcome.report) == ["job failed: rank 1 on host h2 exited with code 3"]


def test_outcome_lines_for_signals_and_timeouts() -> None:
    def lines(result: LaunchResult, timeout: float | None) -> list[str]:
        return job_report_lines(build_report(
            result.exit_code, result.failure, result.ranks, interrupted_by=result.interrupted_by,
            timed_out=result.timed_out, timeout=timeout))

    assert lines(LaunchResult(130, None, interrupted_by=2), None) == [
        "stopped by SIGINT; all ranks were told to exit"]
    assert lines(LaunchResult(124, None, timed_out=True), 2.5) == [
        "job stopped: it ran longer than --timeout 2.5 s"]
    assert lines(LaunchResult(0, None), None) == []
    assert lines(LaunchResult(141, None, interrupted_by=13), None) == []  # `| head`: quiet


def test_no_mpirun_is_a_usage_error_unless_dry_run(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("MY_TOKEN", "x")
    with pytest.raises(UsageError, match="mpirun not found on PATH"):
        session.prepare(request(tmp_path), lambda e: None)
    prepared = session.prepare(request(tmp_path), lambda e: None, dry_run=True)
    assert prepared.mpirun is None and prepared.plan.argv[0] == "mpirun"
