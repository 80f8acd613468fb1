"""Issue 26's pure parts: `--ranks` read and resolved, host and rank ranges, the job report
(root cause first, the rest grouped), its text and JSON, the console filter and the progress
events of the output demultiplexer, and the time an exit record carries."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path

import pytest
from helpers.records import record
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.console.render import ProgressLine, job_report_lines, job_report_to_dict
from dtlaunch.core.errors import UsageError
from dtlaunch.core.failure import Failure
from dtlaunch.core.records import RankExit, parse_record
from dtlaunch.doctor.preflight import PreflightFailure
from dtlaunch.plan.rank_filter import RankFilter, parse_rank_filter
from dtlaunch.run.events import HOSTS_CHECKED, HOSTS_UP, RANKS_RUNNING, Progress
from dtlaunch.run.execute import first_failed_rank
from dtlaunch.run.failure_report import (
    TAIL_BYTES,
    JobRanks,
    RankEnd,
    build_report,
    host_ranges,
    number_ranges,
    tail_lines,
)
from dtlaunch.run.job_output import JobOutput

# --- --ranks ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "hosts", "shown"), [
    ("0", "aaaa", {0}),
    ("0,3-5", "aaaaaaaa", {0, 3, 4, 5}),
    ("last", "aaaa", {3}),
    ("LAST,0", "aaaa", {0, 3}),
    ("all", "aaa", {0, 1, 2}),
    ("2-9", "aaaa", {2, 3}),
    ("7", "aaaa", set()),
])
def test_ranks_spec_picks_the_ranks(spec: str, hosts: str, shown: set[int]) -> None:
    assert parse_rank_filter(spec).shown(list(hosts)) == shown


def test_local_ranks_are_counted_on_each_host_as_torchrun_counts_them() -> None:
    """torchrun's --local-ranks-filter 0: the first rank of every host; `last`: each host's
    last rank, however many each has."""
    hosts = ["h1", "h1", "h2", "h2", "h2", "h3"]
    assert parse_rank_filter("0", local=True).shown(hosts) == {0, 2, 5}
    assert parse_rank_filter("1", local=True).shown(hosts) == {1, 3}
    assert parse_rank_filter("last", local=True).shown(hosts) == {1, 4, 5}
    assert parse_rank_filter("1-2", local=True).shown(hosts) == {1, 3, 4}


def test_a_spec_naming_no_rank_of_the_job_says_so() -> None:
    assert parse_rank_filter("9").unused(["h1"] * 4) == (
        "--ranks 9: the job has no such rank (4 rank(s)); only failures will be shown")
    assert parse_rank_filter("0").unused(["h1"]) is None
    assert "no such local rank" in (parse_rank_filter("3", local=True).unused(["h1"]) or "")


@pytest.mark.parametrize(("spec", "message"), [
    ("", "expected ranks like 0 or 0,3-5 or last or all"),
    (" ", "expected ranks like"),
    ("1,", "expected ranks like"),
    ("-1", "'-1' is not a rank"),
    ("a-b", "'a-b' is not a rank"),
    ("1-", "'1-' is not a rank"),
    ("5-3", "the range 5-3 runs backwards"),
    ("1" * 10, "is not a rank"),  # more than 9 digits: a typo, not a rank
    ("0;1", "'0;1' is not a rank"),
])
def test_a_bad_spec_is_one_usage_error(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")) as caught:
        parse_rank_filter(spec)
    assert "\n" not in str(caught.value)


@given(st.sets(st.integers(0, 60), min_size=1), st.integers(1, 70))
def test_the_spec_written_from_ranges_reads_back_as_the_same_ranks(ranks: set[int],
                                                                  size: int) -> None:
    spec = number_ranges(sorted(ranks))
    assert parse_rank_filter(spec).shown(["h"] * size) == {r for r in ranks if r < size}


# --- ranges -------------------------------------------------------------------------------


def test_number_ranges() -> None:
    assert number_ranges([8, 9, 10, 3, 0, 1, 2, 5]) == "0-3,5,8-10"
    assert number_ranges([4]) == "4"
    assert number_ranges([]) == ""


def test_host_ranges_join_consecutive_numbers_and_keep_names_and_widths() -> None:
    assert host_ranges([f"h{i}" for i in range(2, 17)]) == "h2-h16"
    assert host_ranges(["node001", "node002", "node003", "node010"]) == "node001-node003,node010"
    assert host_ranges(["h1", "h1", "h2", "login", "h3"]) == "h1-h2,login,h3"
    assert host_ranges(["gpu1.a", "gpu2.a", "gpu3.b"]) == "gpu1.a-gpu2.a,gpu3.b"
    assert host_ranges(["n9", "n10", "n011"]) == "n9-n10,n011"  # padded is another family
    assert host_ranges([f"h{i}" for i in range(0, 40, 2)], shown=3) == "h0,h2,h4 and 17 more"


# --- the report ---------------------------------------------------------------------------

HOSTS = tuple(["h1"] * 8 + [f"h{2 + i // 4}" for i in range(56)])  # 64 ranks on h1-h15


def ends(**special: tuple[str | None, float | None]) -> tuple[RankEnd, ...]:
    out = []
    for rank, host in enumerate(HOSTS):
        how, at = special.get(f"r{rank}", ("signal 15", 100.5))
        out.append(RankEnd(rank, host, how, at, rank))
    return tuple(out)


def test_the_root_cause_is_first_in_time_and_the_rest_is_one_line_per_cause() -> None:
    """64 ranks: rank 3 exits 1 first, rank 9 is killed by SIGKILL a little later, the rest
    get SIGTERM from the launcher and ranks 0-2 finished cleanly."""
    ranks = JobRanks(HOSTS, ends(r3=("exit 1", 100.0), r9=("signal 9", 100.2),
                                 r0=("exit 0", 99.0), r1=("exit 0", 99.0), r2=("exit 0", 99.0)),
                     {3: ("loss 2.3", "RuntimeError: NCCL error")}, reported=True)
    # mpirun noticed rank 9 first; the records say rank 3 ended first.
    report = build_report(1, Failure(9, "h2", signal=9), ranks)
    assert report.root is not None
    root = report.root.failure
    assert (root.rank, root.host, root.exit_code) == (3, "h1", 1)
    assert report.root.last_lines == ("loss 2.3", "RuntimeError: NCCL error")
    assert [g.line() for g in report.others] == [
        "ranks 4-8,10-63 on h1-h15: SIGTERM after rank 3 failed",
        "rank 9 on h2: SIGKILL after rank 3 failed"]
    lines = job_report_lines(report)
    assert lines[0].startswith("root cause (first failure): rank 3 on host h1 exited with code 1 at ")
    assert lines[1:4] == ["  its last 2 line(s):", "    [3@h1] loss 2.3",
                          "    [3@h1] RuntimeError: NCCL error"]
    assert lines[-1] == "job failed: rank 3 on host h1 exited with code 1"
    assert len(lines) == 7

    data = json.loads(json.dumps(job_report_to_dict(report, 1)))
    assert data["root_cause"]["rank"] == 3 and data["root_cause"]["at"] == 100.0
    assert data["root_cause"]["last_lines"] == ["loss 2.3", "RuntimeError: NCCL error"]
    assert [(g["ranks_text"], g["hosts_text"], g["signal_name"]) for g in data["other_failures"]] \
        == [("4-8,10-63", "h1-h15", "SIGTERM"), ("9", "h2", "SIGKILL")]
    assert len(data["other_failures"][0]["ranks"]) == 59
    assert data["summary"] == lines[-1] and data["status"] == "failed"


def test_a_named_reason_is_kept_and_records_without_times_go_by_their_order() -> None:
    ranks = JobRanks(("h1", "h2"), (RankEnd(0, "h1", "exit 3", None, 1),
                                    RankEnd(1, "h2", "exit 3", 5.0, 0)), reported=True)
    abort = Failure(0, "h1", exit_code=3, reason="called MPI_Abort")
    report = build_report(3, abort, ranks)
    assert report.root is not None and report.root.failure.rank == 0  # mpirun's reason stands
    assert first_failed_rank({0: "exit 3", 1: "exit 4"}, ["h1", "h2"]) == Failure(0, "h1", exit_code=3)
    assert first_failed_rank({0: "exit 3", 1: "exit 4"}, ["h1", "h2"], {0: 9.0, 1: 8.0}) \
        == Failure(1, "h2", exit_code=4)


def test_a_job_that_never_started_has_just_its_line_and_no_groups() -> None:
    ranks = JobRanks(("h1", "h2"), (RankEnd(0, "h1", None), RankEnd(1, "h2", None)))
    failure = Failure(host="h2", reason="mpirun could not start its daemon on host h2")
    report = build_report(1, failure, ranks)
    assert job_report_lines(report) == ["job failed: mpirun could not start its daemon on host h2"]
    ranks = JobRanks(("h1", "h2"), (RankEnd(0, "h1", None), RankEnd(1, "h2", "exit 0")),
                     reported=True)
    lost = Failure(host="h1", reason="lost the SSH connection to host h1")
    assert [g.line() for g in build_report(1, lost, ranks).others] == [
        "rank 0 on h1: no exit record (ended with the job) after host h1 failed"]


def test_stops_timeouts_success_and_a_reader_gone() -> None:
    nothing = JobRanks()
    assert job_report_lines(build_report(0, None, nothing)) == []
    stopped = build_report(130, None, nothing, interrupted_by=signal.SIGINT)
    assert stopped.status == "stopped" and job_report_lines(stopped) == [
        "stopped by SIGINT; all ranks were told to exit"]
    late = build_report(124, None, nothing, timed_out=True, timeout=3)
    assert late.status == "timed-out" and job_report_to_dict(late, 124)["notes"] == [
        "job stopped: it ran longer than --timeout 3 s"]
    assert job_report_lines(build_report(141, None, nothing, interrupted_by=signal.SIGPIPE)) == []
    refused = job_report_to_dict(None, 1, PreflightFailure((("h2", "ssh"),), job_started=False))
    assert refused["status"] == "not-started"
    assert refused["error"] == refused["summary"] == (
        "pre-flight checks failed: h2 (ssh); not launching "
        "(fix the problems above, or pass --no-check)")


def test_tail_lines_keep_the_last_whole_lines_as_last_drawn() -> None:
    assert tail_lines(b"a\n\nb 10%\rb 50%\rb 100%\nc") == ("a", "b 100%", "c")
    assert tail_lines(b"".join(b"%d\n" % i for i in range(30))) == tuple(
        str(i) for i in range(20, 30))
    rest = b"x" * 100 + b"\nlast\n"
    cut = b"y" * (TAIL_BYTES - len(rest) - 1) + b"\n" + rest  # as kept: its first line cut
    assert tail_lines(cut) == ("x" * 100, "last")  # the cut line is left out
    assert tail_lines(b"z" * 1000)[0].endswith("...")


# --- the demultiplexer: filter, tails, progress, exit times ------------------------------------


def tagged(rank: int, kind: str, data: bytes) -> bytes:
    return b"[1,%d]<stdout>:" % rank + record(rank, kind, data)


def test_the_console_filter_hides_other_ranks_but_logs_and_tails_keep_everything(
        tmp_path: Path) -> None:
    out, err = io.BytesIO(), io.BytesIO()
    job = JobOutput(("h1", "h1", "h2"), tmp_path, stdout=out, stderr=err, shown=frozenset({0}))
    job.feed(tagged(0, "o", b"zero\n") + tagged(1, "o", b"one\n") + tagged(2, "e", b"two\n")
             + b"mpirun says\n", False)
    job.feed(tagged(1, "x", b"exit 3 @17.5") + tagged(2, "x", b"signal 15"), False)
    job.close()
    assert out.getvalue() == b"[0@h1] zero\n"
    assert err.getvalue() == b"mpirun says\n"  # the launcher's own lines always show
    assert [(tmp_path / f"rank.{r}.log").read_bytes() for r in range(3)] == [
        b"zero\n", b"one\n", b"two\n"]
    ranks = job.job_ranks()
    assert ranks.tails == {0: ("zero",), 1: ("one",), 2: ("two",)}  # hidden or not
    assert [(e.how, e.at) for e in ranks.ends] == [(None, None), ("exit 3", 17.5),
                                                   ("signal 15", None)]


def test_with_json_every_rank_line_goes_to_stderr() -> None:
    out, err = io.BytesIO(), io.BytesIO()
    job = JobOutput(("h1",), None, stdout=out, stderr=err, ranks_to_stderr=True)
    job.feed(tagged(0, "o", b"out\n") + tagged(0, "e", b"err\n"), False)
    job.close()
    assert out.getvalue() == b"" and err.getvalue() == b"[0@h1] out\n[0@h1] err\n"


def test_progress_counts_ranks_and_hosts_and_ends_before_the_first_output() -> None:
    seen: list[Progress] = []
    out = io.BytesIO()
    job = JobOutput(("h1", "h1", "h2"), None, stdout=out, stderr=io.BytesIO(),
                    on_progress=seen.append)
    job.feed(tagged(0, "h", b"h1") + tagged(2, "h", b"h2"), False)
    assert seen[-2:] == [Progress(HOSTS_UP, 2, 2), Progress(RANKS_RUNNING, 2, 3)]

    class Watch(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            assert seen[-1].final, "the line must be gone before output is written"
            return super().write(data)

    job.consoles["stdout"].handle = Watch()
    job.feed(tagged(0, "o", b"hi\n"), False)
    assert seen[-1] == Progress(RANKS_RUNNING, 2, 3, final=True)
    count = len(seen)
    job.feed(tagged(1, "h", b"h1"), False)
    assert len(seen) == count  # the start is over: no more counts


def test_progress_ends_when_every_rank_runs() -> None:
    seen: list[Progress] = []
    job = JobOutput(("h1",), None, stdout=io.BytesIO(), stderr=io.BytesIO(),
                    on_progress=seen.append)
    job.feed(tagged(0, "h", b"h1"), False)
    assert seen[-1] == Progress(RANKS_RUNNING, 1, 1, final=True)


@pytest.mark.parametrize("enabled", [False, True])  # True: stderr is no terminal here
def test_a_progress_line_off_a_terminal_draws_nothing(enabled: bool,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    line = ProgressLine(enabled=enabled)
    with line:
        line.update(Progress(HOSTS_CHECKED, 1, 4))
        line.hosts_checked(2, 4, "h1")
        line.pause()
        line.update(Progress(RANKS_RUNNING, 0, 4))
    assert line.live is None and capsys.readouterr() == ("", "")
    assert not line.enabled


def test_exit_records_carry_the_programs_end_time_and_old_ones_still_read() -> None:
    event = parse_record(record(3, "x", b"signal 9 @1700000000.125")[:-1], None)
    assert event == RankExit(3, "signal 9") and isinstance(event, RankExit)
    assert event.at == 1700000000.125
    old = parse_record(record(3, "x", b"exit 2")[:-1], None)
    assert isinstance(old, RankExit) and (old.how, old.at) == ("exit 2", None)
    odd = parse_record(record(3, "x", b"exit 2 @nan")[:-1], None)
    assert isinstance(odd, RankExit) and (odd.how, odd.at) == ("exit 2", None)


def test_rank_filter_is_a_value() -> None:
    assert parse_rank_filter("0,2") == RankFilter(frozenset({0, 2}), spec="0,2")
