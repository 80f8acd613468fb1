from __future__ import annotations

from dtlaunch.failures import analyze
from dtlaunch.output import Line, TagDemux


def test_chunks_of_one_line_are_joined_per_rank() -> None:
    demux = TagDemux()
    out = demux.feed("[1,0]<stdout>:rank[1,1]<stdout>:rank 1 of 2 [1,0]<stdout>: 0[1,1]<stdout>:on h2\n")
    assert out == [Line(1, "stdout", "rank 1 of 2 on h2")]
    assert demux.feed("[1,0]<stdout>: done\n") == [Line(0, "stdout", "rank 0 done")]


def test_untagged_lines_are_mpiruns_own_and_partials_flush() -> None:
    demux = TagDemux()
    assert demux.feed("mpirun noticed something\n", from_stderr=True) == [
        Line(None, "stderr", "mpirun noticed something")
    ]
    assert demux.feed("[1,3]<stderr>:no newline") == []
    assert demux.flush() == [Line(3, "stderr", "no newline")]


EXIT_CODE_TEXT = """--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[52439,1],2]
  Exit code:    3
--------------------------------------------------------------------------"""


def test_exit_code_failure_names_rank_and_mapped_host() -> None:
    failure = analyze(EXIT_CODE_TEXT.splitlines(), ("a", "a", "b"))
    assert failure is not None
    assert failure.describe() == "rank 2 on host b exited with code 3"


def test_signal_failure_and_first_message_wins() -> None:
    lines = ["mpirun noticed that process rank 1 with PID 77 on node h2 exited on signal 9 (Killed).",
             *EXIT_CODE_TEXT.splitlines()]
    failure = analyze(lines, ("h1", "h2", "h3"))
    assert failure is not None
    assert failure.describe() == "rank 1 on host h2 was killed by signal 9 (SIGKILL)"


def test_daemon_start_failure_points_to_doctor() -> None:
    lines = ["ssh: connect to host 10.0.0.2 port 22: Connection refused",
             "ORTE was unable to reliably start one or more daemons."]
    failure = analyze(lines, ("a", "b"))
    assert failure is not None
    assert "Connection refused" in failure.describe() and "dtlaunch doctor" in failure.describe()


def test_nothing_recognised() -> None:
    assert analyze(["hello"], ("a",)) is None


# Open MPI 5's mpirun (PRRTE), as 5.0.11 prints them.
PRRTE_EXIT = """--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-13381@1,1]
   Exit code:    3
--------------------------------------------------------------------------"""
PRRTE_SIGNAL = """--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 13441 on node h2 exited on
signal 9 (Killed).
--------------------------------------------------------------------------"""
PRRTE_LOST = """--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-h1-34@0,0] on node h1
  Remote daemon: [prterun-h1-34@0,1] on node h2

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------"""


def test_prrte_exit_code_names_rank_and_host() -> None:
    failure = analyze(PRRTE_EXIT.splitlines(), ("h1", "h2"))
    assert failure is not None and failure.describe() == "rank 1 on host h2 exited with code 3"


def test_prrte_signal_wrapped_over_two_lines() -> None:
    failure = analyze(PRRTE_SIGNAL.splitlines(), ("h1", "h2"))
    assert failure is not None
    assert failure.describe() == "rank 1 on host h2 was killed by signal 9 (SIGKILL)"


def test_prrte_lost_daemon_names_the_host() -> None:
    failure = analyze(PRRTE_LOST.splitlines(), ("h1", "h2"))
    assert failure is not None and failure.describe() == "lost the connection to host h2"


def test_prrte_daemon_never_started_is_an_ssh_failure() -> None:
    lines = ["ssh: connect to host 10.0.0.2 port 22: Connection refused", *PRRTE_LOST.splitlines()]
    failure = analyze(lines, ("h1", "h2"))
    assert failure is not None
    assert failure.describe().startswith("mpirun could not start its daemon on host h2 (ssh: "
                                         "connect to host 10.0.0.2 port 22: Connection refused)")


def test_orte_lost_daemon_still_read() -> None:
    lines = ["ORTE has lost communication with a remote daemon.",
             "  HNP daemon   : [[1234,0],0] on node h1",
             "  Remote daemon: [[1234,0],2] on node h3"]
    failure = analyze(lines, ("h1", "h2", "h3"))
    assert failure is not None and failure.describe() == "lost the connection to host h3"


def test_prrte_daemon_failed_to_report_back_points_to_doctor() -> None:
    lines = ["A daemon failed to report back after being spawned. This could",
             "be due to several factors, including inability to find the",
             "ssh: Could not resolve hostname nohost: Name or service not known"]
    failure = analyze(lines, ("h1", "h2"))
    assert failure is not None
    assert failure.describe().startswith("mpirun could not start its daemon on every host (ssh: ")


def test_open_mpi5_tag_space_is_the_tags_not_the_ranks() -> None:
    demux = TagDemux(space_after_tag=True)
    out = demux.feed("[1,1]<stdout>:   two spaces[1,0]<stdout>: x[1,1]<stdout>:  more\n")
    assert out == [Line(1, "stdout", "  two spaces more")]
    assert demux.feed("[1,0]<stdout>: \n") == [Line(0, "stdout", "x")]
    # Open MPI 3/4: no space of its own, so a leading space is the rank's.
    assert TagDemux().feed("[1,0]<stdout>: indented\n") == [Line(0, "stdout", " indented")]


def test_prrte_daemon_failed_to_report_back_names_the_remote_host() -> None:
    lines = ["A daemon failed to report back after being spawned. This could",
             "back to prterun:", "  Local host:    vm", "  Remote host:   h2",
             "  Daemon exit status: 255"]
    failure = analyze(lines, ("h1", "h2"))
    assert failure is not None and failure.host == "h2"
    assert failure.describe().startswith("mpirun could not start its daemon on host h2;")
