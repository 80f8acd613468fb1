"""Hostile ranks on the real test bed: daemons, floods, binary, fake tags, ignored signals,
closed output, MPI syntax among the arguments, and where rank 0 really runs.

Each of these broke dtlaunch before every rank ran through dtlaunch.agents.rank_shim. No timings are
asserted: a job that would hang is bounded by dtlaunch's own --timeout (exit 124, a failure).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.jobs import assert_no_strays
from helpers.procs import alive
from helpers.suite import SCRIPTS, dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed
HOSTILE = str(SCRIPTS / "hostile_rank.py")


def dtl(bed: TestBed, hosts: str, *args: str, inside: str | None = None,
        extra: tuple[str, ...] = ("--timeout", "90"), **kw: object) -> list[str]:
    argv = dtlaunch_argv("run", "--no-check", "-H", hosts, "--iface", bed.subnet,
                         "--ssh-config", str(bed.ssh_config), *extra, *args)
    return bed.nsenter_argv(inside, argv) if inside is not None else argv


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=180, **kw)  # type: ignore[call-overload]


def pids(out: Path, pattern: str) -> tuple[int, ...]:
    found = [json.loads(p.read_text())["pid"] for p in out.glob("rank.*.json")] if pattern == "rank" \
        else [int(p.read_text()) for p in out.glob(f"{pattern}.*.pid")]
    return tuple(found)


def test_a_rank_that_leaves_a_daemon_ends_the_job_and_the_daemon(bed: TestBed, tmp_path: Path) -> None:
    result = run(dtl(bed, "h1:1,h2:1", HOSTILE, "daemon", str(tmp_path)))
    assert result.returncode == 0, result.stderr  # before: held until --timeout (124)
    assert b"[1@h2] rank 1 started its daemon" in result.stdout
    daemons = pids(tmp_path, "daemon")
    assert len(daemons) == 2
    assert_no_strays(bed, pids=daemons)


def max_child_rss_kb(argv: list[str]) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run argv from a fresh interpreter, so the peak RSS is that of dtlaunch and what it
    waited for (mpirun), not of anything this test session ran before."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "sys.stderr.write('\\nMAXRSS %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
             " sys.exit(r.returncode)")
    result = run([sys.executable, "-c", probe, *argv])
    rss = int(result.stderr.rsplit(b"MAXRSS ", 1)[1].split()[0])
    return result, rss


@pytest.mark.parametrize("mode", ["flood", "lines"])
def test_a_rank_printing_50_mb_is_passed_on_whole_in_bounded_memory(
        bed: TestBed, tmp_path: Path, mode: str) -> None:
    result, rss_kb = max_child_rss_kb(dtl(bed, "h2:1", HOSTILE, mode, str(tmp_path), "50"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count(b"x") == 50_000_000 * (99 if mode == "lines" else 100) // 100
    assert result.stdout.startswith(b"[0@h2] x")
    # Passed on as it came: before, 100 MB without a newline grew dtlaunch to 404 MB.
    assert rss_kb < 64 * 1024, rss_kb


def test_binary_output_and_fake_tags_keep_their_rank(bed: TestBed, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    result = run(dtl(bed, "h1:1,h2:1", HOSTILE, "binary", str(tmp_path),
                     extra=("--timeout", "90", "--output-dir", str(logs))))
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert (logs / f"rank.{rank}.log").read_bytes() == bytes(range(256)) * 2
    result = run(dtl(bed, "h1:1,h2:1", HOSTILE, "faketag", str(tmp_path)))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert sorted(lines) == ["[0@h1] [1,7]<stdout>:I am not rank 7",
                             "[1@h2] [1,7]<stdout>:I am not rank 7"]  # before: [7@?] twice


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ranks_that_ignore_signals_are_stopped_with_what_they_left(
        bed: TestBed, tmp_path: Path, sig: signal.Signals, code: int) -> None:
    proc = subprocess.Popen(dtl(bed, "h1:1,h2:1", HOSTILE, "stubborn", str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    started = [proc.stdout.readline() for _ in range(2)]
    assert all(b"ignores signals" in line for line in started), started
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert_no_strays(bed, pids=pids(tmp_path, "rank") + pids(tmp_path, "daemon"))


def test_a_rank_closing_its_output_early_still_ends_normally(bed: TestBed, tmp_path: Path) -> None:
    result = run(dtl(bed, "h1:1,h2:1", HOSTILE, "closed", str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("closed.*")) == ["closed.0", "closed.1"]
    assert b"[1@h2] rank 1 closes its output" in result.stdout
    assert_no_strays(bed)


def test_mpi_syntax_among_the_arguments_is_the_programs(bed: TestBed, tmp_path: Path) -> None:
    words = ["exit", "0", "--sep", ":", "-np", "1", "/bin/echo", "X"]
    result = run(dtl(bed, "h1:2", "-np", "1", HOSTILE, *words[:1], str(tmp_path), *words[1:]))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.glob("rank.*.json")] == ["rank.0.json"]
    assert json.loads((tmp_path / "rank.0.json").read_text())["argv"] == \
        [words[0], str(tmp_path), *words[1:]]
    assert b"X" not in result.stdout  # before: /bin/echo X ran as rank 1


def test_the_rank_host_map_is_where_ranks_ran_when_launched_from_another_host(
        bed: TestBed, tmp_path: Path) -> None:
    result = run(dtl(bed, "h1:1,h2:1", HOSTILE, "exit", str(tmp_path), "0", inside="h2"))
    assert result.returncode == 0, result.stderr
    ran = {json.loads(p.read_text())["rank"]: json.loads(p.read_text())["host"]
           for p in tmp_path.glob("rank.*.json")}
    for rank, host in ran.items():
        assert f"[{rank}@{host}] rank {rank} on {host}".encode() in result.stdout
    assert ran[0] == "h2"  # Open MPI puts the launching node first; dtlaunch said h1
    failed = run(dtl(bed, "h1:1,h2:1", HOSTILE, "exit", str(tmp_path), "3", inside="h2"))
    last = failed.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("dtlaunch: job failed: rank ") and "exited with code 3" in last
    rank = int(last.split("rank ")[1].split()[0])
    assert f"on host {ran[rank]} " in last


def test_output_dir_write_errors_and_few_file_handles_lose_nothing(bed: TestBed, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank.0.log").symlink_to("/dev/full")  # a full disk for rank 0's log
    result = run(dtl(bed, "h1:1,h2:1", HOSTILE, "exit", str(tmp_path), "0",
                     extra=("--timeout", "90", "--output-dir", str(logs))))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(b"dtlaunch: warning: cannot write") == 1
    assert b"Traceback" not in result.stderr
    assert b"[0@h1] rank 0 on h1" in result.stdout and b"[1@h2] rank 1 on h2" in result.stdout
    assert (logs / "rank.1.log").read_bytes() == b"rank 1 on h2\n"

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    many = tmp_path / "many"
    many.mkdir()
    result = run(dtl(bed, "h1:40,h2:40,h3:40", "/bin/echo", "one line",
                     extra=("--timeout", "120", "--output-dir", str(many))), preexec_fn=few_files)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count(b"one line\n") == 120  # before: 96 of 120 and a traceback
    assert len(list(many.glob("rank.*.log"))) == 120


def test_a_reader_that_goes_away_stops_the_job_quietly(bed: TestBed, tmp_path: Path) -> None:
    reader, writer = os.pipe()
    proc = subprocess.Popen(dtl(bed, "h1:1,h2:1", HOSTILE, "chatty", str(tmp_path)),
                            stdout=writer, stderr=subprocess.PIPE)
    os.close(writer)
    with os.fdopen(reader, "rb") as head:
        assert head.readline().split(b"] ")[1] == b"line 0\n"  # like `| head -1`
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err  # as SIGPIPE would end it; before: traceback, 124
    assert b"Traceback" not in err and b"BrokenPipe" not in err
    assert_no_strays(bed, pids=pids(tmp_path, "rank"))
    assert not any(alive(p) for p in pids(tmp_path, "rank"))
