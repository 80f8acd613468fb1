"""The Slurm node watch's pure parts: who is silent, how a stop is blamed, its srun line."""

from __future__ import annotations

from dtlaunch.core.failure import Failure
from dtlaunch.job.hosts import Host
from dtlaunch.run.execute import LaunchResult
from dtlaunch.run.restarts import AttemptOutcome, blame_hosts, is_lost_host
from dtlaunch.run.slurm_watch import (
    SILENCE,
    STARTUP,
    TASK_CODE,
    NodeWatch,
    blame,
    blame_allocation,
    failed_node,
    node_watch_for,
    parse_job_end,
    silent_nodes,
    watch_argv,
)

NODES = ("h1", "h2", "h3")


def test_a_node_late_while_others_answer_is_silent() -> None:
    now = 100.0
    seen = {"h1": now - 1, "h2": now - 1, "h3": now - SILENCE - 0.5}
    assert silent_nodes(seen, NODES, started=0.0, now=now) == ["h3"]


def test_no_node_is_blamed_when_every_node_is_late() -> None:
    """The launcher or srun stalled (a loaded machine): nothing to pin on one node."""
    now = 100.0
    seen = {n: now - SILENCE - 1 for n in NODES}
    assert silent_nodes(seen, NODES, started=0.0, now=now) == []


def test_a_node_that_never_answered_is_silent_only_after_the_startup_allowance() -> None:
    seen = {"h1": 10.0, "h2": 10.0}
    assert silent_nodes(seen, NODES, started=0.0, now=10.0) == []
    seen = {"h1": STARTUP + 1, "h2": STARTUP + 1}
    assert silent_nodes(seen, NODES, started=0.0, now=STARTUP + 1) == ["h3"]


def test_in_time_nodes_are_not_silent() -> None:
    assert silent_nodes({n: 99.0 for n in NODES}, NODES, started=0.0, now=100.0) == []


def test_watch_only_for_slurm_launches_on_two_or_more_nodes() -> None:
    assert node_watch_for("ssh", ["h1", "h2"], "python3") is None
    assert node_watch_for("slurm", ["h1", "h1"], "python3") is None
    watch = node_watch_for("slurm", ["h1", "h1", "h2"], "python3")
    assert watch is not None and watch.nodes == ("h1", "h2")


def test_watch_argv_broadcasts_stdin_and_runs_fixed_code() -> None:
    argv = watch_argv(["h1", "h2"], "/usr/bin/python3", srun="srun")
    assert argv[:2] == ("srun", "--input=all")
    assert "--overlap" in argv and "--nodelist=h[1-2]" in argv and "--ntasks-per-node=1" in argv
    assert argv[-3:] == ("/usr/bin/python3", "-c", TASK_CODE)


def test_the_watch_starts_nothing_before_its_delay() -> None:
    clock = [0.0]
    watch = NodeWatch(["h1", "h2"], "python3", srun="/nonexistent/srun", clock=lambda: clock[0])
    assert watch.stop_reason() is None and watch.started is None
    watch.close()


def test_a_stop_by_the_watch_names_the_lost_node_and_the_restart_loop_drops_it() -> None:
    watch = NodeWatch(["h1", "h2", "h3"], "python3")
    watch.lost = "h3"
    result = blame(LaunchResult(143, Failure(reason="lost node h3: ...")), watch)
    assert result.failure is not None and result.failure.host == "h3"
    assert is_lost_host(result.failure)
    hosts = (Host("h1", 2), Host("h2", 2), Host("h3", 2))
    assert list(blame_hosts(AttemptOutcome(result.exit_code, result.failure), hosts)) == ["h3"]


def test_an_interrupt_or_timeout_is_not_blamed_on_a_node() -> None:
    watch = NodeWatch(["h1", "h2"], "python3")
    watch.lost = "h2"
    interrupted = LaunchResult(130, None, interrupted_by=2)
    assert blame(interrupted, watch) is interrupted
    timed_out = LaunchResult(124, None, timed_out=True)
    assert blame(timed_out, watch) is timed_out
    unwatched = LaunchResult(1, Failure(rank=0, exit_code=1))
    assert blame(unwatched, None) is unwatched


def test_srun_naming_a_node_it_cannot_reach_names_a_lost_node() -> None:
    """Measured: a node already gone when the watch starts makes srun abort its step with
    'Task launch for StepId=1.4 failed on node h3: Communication connection failure'."""
    line = ("srun: error: Task launch for StepId=1.4 failed on node h3: Communication "
            "connection failure")
    assert failed_node(line, NODES) == "h3"
    assert failed_node("srun: error: Node failure on h2", NODES) == "h2"
    assert failed_node("srun: error: Task launch failed on node h9: ...", NODES) is None
    assert failed_node("srun: error: h1: task 0: Killed", NODES) is None


def test_how_an_allocation_ended_from_scontrol() -> None:
    line = "JobId=7 JobName=x JobState={} Reason={} RunTime={} TimeLimit={} Partition=bed"
    assert parse_job_end(line.format("RUNNING", "None", "00:00:05", "UNLIMITED")) is None
    assert parse_job_end(line.format("COMPLETING", "None", "00:00:05", "UNLIMITED")) == "CANCELLED"
    assert parse_job_end(line.format("COMPLETING", "None", "00:10:00", "00:10:00")) == "TIMEOUT"
    assert parse_job_end(line.format("COMPLETING", "None", "1-00:00:00", "2-00:00:00")) == "CANCELLED"
    assert parse_job_end(line.format("COMPLETING", "NodeDown", "00:00:05", "10")) == "NodeDown"
    assert parse_job_end(line.format("TIMEOUT", "TimeLimit", "00:10:00", "00:10:00")) == "TIMEOUT"
    assert parse_job_end("nothing") is None


def test_a_failure_inside_an_ended_allocation_is_the_allocations() -> None:
    lost = LaunchResult(205, Failure(host="h1", reason="lost the connection to host h1"))
    blamed = blame_allocation(lost, "7", end=lambda job: "CANCELLED")
    assert blamed.failure is not None and blamed.failure.final == "allocation"
    assert blamed.failure.describe() == "the Slurm job 7 was cancelled (scancel)"
    assert blamed.exit_code == 205
    assert blame_allocation(lost, "7", end=lambda job: None) is lost  # still running
    assert blame_allocation(lost, None, end=lambda job: "CANCELLED") is lost  # not in a job
    ok = LaunchResult(0, None)
    assert blame_allocation(ok, "7", end=lambda job: "CANCELLED") is ok
    late = blame_allocation(lost, "7", end=lambda job: "TIMEOUT").failure
    assert late is not None and "reached its time limit" in late.describe()
