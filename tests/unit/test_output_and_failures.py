from __future__ import annotations

import io
from pathlib import Path

from helpers.records import record

from dtlaunch.openmpi.failures import analyze
from dtlaunch.run.job_output import FRAGMENT, JobOutput, earlier_logs, host_name


def tagged(rank: int, kind: str, data: bytes) -> bytes:
    return b"[1,%d]<stdout>:" % rank + record(rank, kind, data)


def job(tmp_path: Path | None = None, **kw: object) -> tuple[JobOutput, io.BytesIO, io.BytesIO]:
    out, err = io.BytesIO(), io.BytesIO()
    return JobOutput(("h1", "h1", "h2"), tmp_path, stdout=out, stderr=err, **kw), out, err  # type: ignore[arg-type]


def test_whole_lines_per_rank_even_when_ranks_write_pieces() -> None:
    output, out, err = job()
    output.feed(tagged(0, "o", b"rank") + tagged(1, "o", b"rank 1 of 2 ") + tagged(0, "o", b" 0")
                + tagged(1, "o", b"on h2\n") + b"mpirun noticed something\n", False)
    output.feed(tagged(0, "o", b" done\n"), False)
    output.close()
    assert out.getvalue() == b"[1@h1] rank 1 of 2 on h2\n[0@h1] rank 0 done\n"
    assert err.getvalue() == b"mpirun noticed something\n"
    assert list(output.launcher_lines) == ["mpirun noticed something"]


def test_the_host_a_rank_reports_names_it() -> None:
    output, out, _ = job()
    output.feed(tagged(0, "h", b"h2") + tagged(0, "o", b"hi\n") + tagged(2, "h", b"h1.cluster")
                + tagged(2, "o", b"[1,7]<stdout>:fake tag\n"), False)
    output.close()
    assert out.getvalue() == b"[0@h2] hi\n[2@h1] [1,7]<stdout>:fake tag\n"
    assert output.rank_hosts() == ("h2", "h1", "h1")
    assert host_name("node7", "h1", ("h1", "h2")) == "node7"


def test_an_open_line_is_printed_when_long_and_at_the_end() -> None:
    output, out, _ = job()
    for _ in range(3 * FRAGMENT // 3000):
        output.feed(tagged(1, "o", b"x" * 3000), False)
    assert len(out.getvalue()) >= 2 * FRAGMENT  # shown as it comes, not held to the end
    output.feed(tagged(2, "e", b"no newline"), False)
    output.close()
    assert out.getvalue().count(b"x") == 3 * FRAGMENT // 3000 * 3000


def test_a_line_break_after_carriage_return_redraws_leaves_no_empty_tagged_line() -> None:
    """A bar drawn as `10%\r`, `20%\r`, then ended with `\n`: the held \r goes out on its own
    once it waited LIVE_DELAY, and the \n after it must not start a new tagged line."""
    output, out, _ = job()
    for piece in (b"10%\r", b"20%\r", b"\n", b"done\n"):
        output.feed(tagged(0, "o", piece), False)
        output.since = dict.fromkeys(output.since, 0.0)  # as if LIVE_DELAY had passed
        output.tick()
    output.close()
    assert out.getvalue() == b"[0@h1] 10%\r[0@h1] 20%\r\n[0@h1] done\n"
    lines = out.getvalue().replace(b"\r", b"\n").split(b"\n")
    assert b"[0@h1] " not in lines  # no line that is only a tag


def test_timestamps_prefix_each_line() -> None:
    output, out, _ = job(timestamps=True, clock=lambda: 0.25)
    output.feed(tagged(0, "o", b"a\nb\n"), False)
    output.close()
    lines = out.getvalue().decode().splitlines()
    assert len(lines) == 2 and all(line.endswith(("[0@h1] a", "[0@h1] b")) for line in lines)
    assert lines[0].split()[1].endswith(".250")


def test_log_files_keep_exact_bytes_and_a_write_error_costs_one_warning(tmp_path: Path) -> None:
    output, out, err = job(tmp_path)
    (tmp_path / "rank.1.log").mkdir()  # cannot be written as a file
    output.feed(tagged(0, "o", b"\x00\xff\r\n") + tagged(1, "o", b"one\n"), False)
    output.tick()
    output.feed(tagged(1, "o", b"two\n"), False)
    output.close()
    assert (tmp_path / "rank.0.log").read_bytes() == b"\x00\xff\r\n"
    assert out.getvalue().endswith(b"[1@h1] one\n[1@h1] two\n")
    assert err.getvalue().count(b"dtlaunch: warning: cannot write") == 1


def test_each_attempt_and_each_later_run_starts_its_own_marked_line(tmp_path: Path) -> None:
    """Under --max-restarts every part is marked with the attempt and the rank's host; a
    later run appending to an earlier run's log is marked too, and an earlier part that ended
    mid-line stays whole (issue 27)."""
    first, _, _ = job(tmp_path, log_label="attempt 1 (DTLAUNCH_RESTART_COUNT=0)", clock=lambda: 0)
    first.feed(tagged(1, "h", b"h2") + tagged(1, "o", b"partial"), False)
    first.close()
    second, _, _ = job(tmp_path, log_label="attempt 2 (DTLAUNCH_RESTART_COUNT=1)", clock=lambda: 0)
    second.feed(tagged(1, "h", b"h3") + tagged(1, "o", b"whole\n"), False)
    second.close()
    later, _, _ = job(tmp_path, clock=lambda: 0)  # a plain run, same folder
    later.feed(tagged(1, "o", b"again\n") + tagged(0, "o", b"fresh\n"), False)
    later.close()
    lines = (tmp_path / "rank.1.log").read_text().splitlines()
    assert [line.split(", 19")[0] for line in lines] == [
        "--- dtlaunch: attempt 1 (DTLAUNCH_RESTART_COUNT=0), rank 1 on h2", "partial",
        "--- dtlaunch: attempt 2 (DTLAUNCH_RESTART_COUNT=1), rank 1 on h3", "whole",
        "--- dtlaunch: a new run, rank 1 on h1", "again"]
    assert (tmp_path / "rank.0.log").read_text() == "fresh\n"  # new file, plain run: as is
    assert earlier_logs(tmp_path) == ["rank.0.log", "rank.1.log"]
    assert earlier_logs(tmp_path / "missing") == []


def test_a_write_error_found_at_the_end_is_still_told(tmp_path: Path) -> None:
    """A job shorter than a tick: its log is first written at close, and the warning about it
    was dropped (the console had been written already)."""
    output, _, err = job(tmp_path)
    (tmp_path / "rank.0.log").mkdir()
    output.feed(tagged(0, "o", b"only line\n"), False)
    output.close()
    assert err.getvalue().count(b"dtlaunch: warning: cannot write") == 1


def test_many_ranks_need_no_handle_each(tmp_path: Path) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    output, _, err = job(tmp_path)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        for rank in range(120):
            output.feed(tagged(rank, "o", b"line %d\n" % rank), False)
        output.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert err.getvalue() == b""
    assert len(list(tmp_path.glob("rank.*.log"))) == 120


def test_a_console_nobody_reads_is_noted_not_raised() -> None:
    class Closed(io.BytesIO):
        def write(self, data: object) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    output = JobOutput(("h1",), None, stdout=Closed(), stderr=io.BytesIO())
    output.feed(tagged(0, "o", b"hi\n"), False)
    output.feed(tagged(0, "o", b"again\n"), False)
    assert output.broken_pipe


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
    from dtlaunch.openmpi.output import TagSplitter

    five = TagSplitter(space_after_tag=True)
    pieces = five.feed(b"[1,1]<stdout>:   two[1,0]<stdout>: x\n[1,1]<stdout>:")
    assert pieces == [((1, "stdout"), b"  two"), ((0, "stdout"), b"x\n")]
    # the tag's own space arrives in the next read
    assert five.feed(b" more\n") == [((1, "stdout"), b"more\n")]
    # Open MPI 3/4: no space of its own, so a leading space is the rank's.
    assert TagSplitter().feed(b"[1,0]<stdout>: indented\n") == [((0, "stdout"), b" indented\n")]


def test_prrte_daemon_failed_to_report_back_names_the_remote_host() -> None:
    lines = ["A daemon failed to report back after being spawned. This could",
             "back to prterun:", "  Local host:    vm", "  Remote host:   h2",
             "  Daemon exit status: 255"]
    failure = analyze(lines, ("h1", "h2"))
    assert failure is not None and failure.host == "h2"
    assert failure.describe().startswith("mpirun could not start its daemon on host h2;")


def test_no_launching_agent_names_the_missing_component() -> None:
    """PRRTE (Open MPI 5) told to use a launcher it does not have (plm = isolated is ORTE's):
    its two help blocks become one line that names the component and where to unset it."""
    lines = ["-" * 74, "A requested component was not found, or was unable to be opened.  This",
             "means that this component is either not installed or is unable to be",
             "used on your system (e.g., sometimes this means that shared libraries",
             "that the component requires are unable to be found/loaded).  Note that",
             "PMIx stopped checking at the first component that it did not find.", "",
             "Host:      vm", "Framework: plm", "Component: isolated", "-" * 74, "-" * 74,
             "No available launching agents were found.", "",
             "This is an unusual error; it means that PRTE was unable to find",
             "any mechanism to launch proceses, and therefore is unable to start the",
             "process(es) required by your application.", "-" * 74]
    failure = analyze(lines, ["h1", "h2"])
    assert failure is not None and failure.rank is None and failure.host is None
    assert failure.describe().startswith(
        "mpirun found no launcher it can use (plm = isolated, a component it does not have); "
        "'prte_info --all' shows"), failure.describe()
    assert "~/.prte/mca-params.conf" in failure.describe()
    bare = analyze(["No available launching agents were found."], ["h1"])
    assert bare is not None and bare.describe().startswith("mpirun found no launcher it can use;")


def test_every_slot_filled_points_to_the_launcher_setting() -> None:
    """What mpirun says when plm = isolated (a single-machine launcher) is set in a parameter
    file for a job across hosts: dtlaunch says what it probably is and how to find it."""
    lines = ["-" * 74, "All nodes which are allocated for this job are already filled.", "-" * 74]
    failure = analyze(lines, ["h1", "h2"])
    assert failure is not None
    assert failure.rank is None and failure.host is None
    assert failure.describe().startswith("mpirun found every slot it may use already filled")
    assert "ompi_info --param plm base --level 2" in failure.describe()
