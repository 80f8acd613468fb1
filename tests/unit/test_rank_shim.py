"""The rank shim's protocol: the program's argv as one opaque word, records, and reading them
back from Open MPI's tagged stream however it was cut (fuzzed). Real shim processes run here
too: they need no MPI (the rank comes from the environment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.procs import alive
from helpers.records import CHUNK, record
from hypothesis import given, settings
from hypothesis import strategies as st

from dtlaunch.agents.rank_shim import (
    ESC,
    MIN_RECORD,
    PIPE_BUF,
    decode_argv,
    encode_argv,
    escape,
    records,
    unescape,
    wrap_program,
)
from dtlaunch.core.records import (
    RECORD_LIMIT,
    Piece,
    RankExit,
    RankHost,
    RankNotStarted,
    RecordParser,
)
from dtlaunch.openmpi.output import OpenMpiDemux, TagSplitter

HOSTILE = ["prog.py", "--sep", ":", "-np", "1", "/bin/echo", "X", "", "a b", "\udcff", "\n", "-H"]


def test_the_argv_travels_as_one_word_that_no_launcher_can_read() -> None:
    word = encode_argv(HOSTILE)
    assert decode_argv(word) == HOSTILE
    assert word.isascii() and not any(c in word for c in ": -\n\"'$")
    wrapped = wrap_program(HOSTILE, "python3")
    assert wrapped[0] == "python3" and wrapped[-1] == word
    assert ":" not in wrapped and "-np" not in wrapped and "/bin/echo" not in wrapped


def test_records_fit_one_atomic_write() -> None:
    assert len(record(99999999, "o", b"\n[" * (CHUNK // 2))) <= PIPE_BUF
    assert record(3, "o", b"[1,7]<stdout>:x\n").count(b"\n") == 1
    worst = (b"\n" + ESC + b"[") * 5000
    cut = records(99999999, "o", worst)
    assert len(cut) > 1 and all(len(r) <= PIPE_BUF and r.count(b"\n") == 1 for r in cut)
    assert b"".join(read_all(b"".join(cut))[i].data for i in range(len(cut))) == worst  # type: ignore[attr-defined]
    assert len(records(0, "o", b"x" * 100_000, 1 << 20)) == 1  # tagged launchers: one write


@given(st.binary(), st.integers(MIN_RECORD, 600))
def test_escaping_is_exact_and_leaves_no_newline_or_bracket(data: bytes, limit: int) -> None:
    assert unescape(escape(data)) == data
    assert b"\n" not in escape(data) and b"[" not in escape(data)
    assert escape(b"plain text, no specials") == b"plain text, no specials"
    cut = records(7, "e", data, limit)
    assert all(len(r) <= limit and r.endswith(b"\n") and b"[" not in r for r in cut)
    assert b"".join(unescape(r.split(b" ", 3)[3][:-1]) for r in cut) == data


def tagged(rank: int, data: bytes, stream: str = "stdout") -> bytes:
    """One chunk as mpirun --tag-output passes it on: the tag starts it and every line in it."""
    tag = b"[1,%d]<%s>:" % (rank, stream.encode())
    end = b"\n" if data.endswith(b"\n") else b""
    return tag + data[:len(data) - len(end)].replace(b"\n", b"\n" + tag) + end


def test_a_record_split_by_mpirun_is_joined_per_rank() -> None:
    a, b = record(0, "o", b"hello\n"), record(1, "e", b"[1,7]<stdout>:fake\n")
    stream = tagged(0, a[:9]) + tagged(1, b) + tagged(0, a[9:]) + b"mpirun says hi\n"
    demux = OpenMpiDemux()
    events = demux.feed(stream[:5]) + demux.feed(stream[5:]) + demux.flush()
    assert events == [Piece(1, "stderr", b"[1,7]<stdout>:fake\n"), Piece(0, "stdout", b"hello\n"),
                      Piece(None, "stdout", b"mpirun says hi\n")]


def test_hosts_exits_and_raw_text() -> None:
    demux = OpenMpiDemux(stream="stderr")
    events = demux.feed(tagged(2, record(2, "h", b"h2")) + tagged(2, record(2, "x", b"signal 9"))
                        + tagged(5, b"Traceback of the shim\n", "stderr") + b"untagged\n")
    assert events == [RankHost(2, "h2"), RankExit(2, "signal 9"),
                      Piece(5, "stderr", b"Traceback of the shim\n"), Piece(None, "stderr", b"untagged\n")]


def test_untagged_launcher_text_waits_for_its_line_but_is_capped() -> None:
    splitter = TagSplitter()
    assert splitter.feed(b"abc") == [] and splitter.feed(b"def\n") == [(None, b"abcdef\n")]
    big = b"x" * 200_000
    assert sum(len(d) for _, d in splitter.feed(big)) == len(big)
    plain = RecordParser(whole=RECORD_LIMIT)
    assert plain.feed(record(4, "o", b"hi")[:-1]) == []  # no newline yet
    assert plain.feed(b"\n") == [Piece(4, "stdout", b"hi")]


def test_untagged_records_must_come_whole_within_their_limit() -> None:
    """Without tags a record is only one when it arrives whole: one longer than the limit is
    the launcher's text, and so is a line that only starts like a record."""
    plain = RecordParser(whole=512)
    long = record(4, "o", b"y" * 600)
    events = plain.feed(long) + plain.feed(record(5, "o", b"ok") + b"\x1edtl2 x\n") + plain.flush()
    assert events == [Piece(None, "stdout", long), Piece(5, "stdout", b"ok"),
                      Piece(None, "stdout", b"\x1edtl2 x\n")]
    assert RecordParser(whole=1024).feed(long) == [Piece(4, "stdout", b"y" * 600)]


def test_a_tagged_record_is_passed_on_as_it_comes() -> None:
    """Open MPI's records are large: their payload goes on piece by piece (an escape pair cut
    in two waits for its second byte), consecutive pieces of a read as one."""
    payload = b"ab\ncd[" * 1000
    wire = record(1, "o", payload)
    demux = OpenMpiDemux()
    first = demux.feed(tagged(1, wire[:100]) + tagged(1, wire[100:200]))
    assert len(first) == 1 and isinstance(first[0], Piece)
    rest = [e for i in range(200, len(wire), 333) for e in demux.feed(tagged(1, wire[i:i + 333]))]
    assert b"".join(e.data for e in first + rest + demux.flush()) == payload  # type: ignore[union-attr]


chunks = st.binary(max_size=CHUNK)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("oe"), chunks), max_size=30),
       st.data(), st.sampled_from([MIN_RECORD, PIPE_BUF, 1 << 20]))
def test_any_interleaving_and_cutting_gives_each_rank_its_bytes_in_order(
        writes: list[tuple[int, str, bytes]], data: st.DataObject, limit: int) -> None:
    """Ranks write records (of any size limit); mpirun forwards each rank's stream in pieces
    of any size, tags them and interleaves the pieces of different ranks in any order;
    dtlaunch reads the result in reads of any size."""
    per_rank: dict[int, bytes] = {}
    for rank, kind, payload in writes:
        per_rank[rank] = per_rank.get(rank, b"") + b"".join(records(rank, kind, payload, limit))
    pieces: dict[int, list[bytes]] = {}
    for rank, stream in per_rank.items():
        cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=6)))
        bounds = [0, *cuts, len(stream)]
        pieces[rank] = [stream[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    order = data.draw(st.permutations([r for r, ps in pieces.items() for _ in ps]))
    taken = dict.fromkeys(pieces, 0)
    wire = b""
    for rank in order:
        wire += tagged(rank, pieces[rank][taken[rank]])
        taken[rank] += 1
    reads = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    demux = OpenMpiDemux()
    events = []
    for a, b in zip([0, *reads], [*reads, len(wire)]):
        events += demux.feed(wire[a:b])
    events += demux.flush()
    got: dict[tuple[int, str], bytes] = {}
    for event in events:
        assert isinstance(event, Piece) and event.rank is not None
        got[(event.rank, event.stream)] = got.get((event.rank, event.stream), b"") + event.data
    want: dict[tuple[int, str], bytes] = {}
    for rank, kind, payload in writes:
        key = (rank, "stdout" if kind == "o" else "stderr")
        want[key] = want.get(key, b"") + payload
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(-1, 3), st.sampled_from("oe"), chunks), max_size=30),
       st.lists(st.integers(0, 1 << 16), max_size=8))
def test_whole_records_among_launcher_lines_in_reads_of_any_size(
        writes: list[tuple[int, str, bytes]], reads: list[int]) -> None:
    """Untagged (RecordParser's `whole`): records written whole between the launcher's own lines, read in
    any cuts, give each rank its bytes and the launcher its lines."""
    wire = b""
    want: dict[int | None, bytes] = {}
    for rank, kind, payload in writes:
        if rank < 0:
            line = payload.replace(b"\n", b"").replace(b"\x1e", b"") + b"\n"
            wire += line
            want[None] = want.get(None, b"") + line
        else:
            wire += b"".join(records(rank, kind, payload))
            want[rank] = want.get(rank, b"") + payload
    demux = RecordParser(whole=RECORD_LIMIT)
    events = []
    cuts = sorted(min(r, len(wire)) for r in reads)
    for a, b in zip([0, *cuts], [*cuts, len(wire)]):
        events += demux.feed(wire[a:b])
    events += demux.flush()
    got: dict[int | None, bytes] = {}
    for event in events:
        assert isinstance(event, Piece)
        got[event.rank] = got.get(event.rank, b"") + event.data
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}


def test_demux_is_linear_on_a_long_stream() -> None:
    """100 MB of one rank without a newline, read as mpirun would pass it on: no quadratic
    joining (this ran for minutes before) and nothing held back."""
    payload = b"y" * CHUNK
    one = tagged(0, record(0, "o", payload) * 10)
    demux = OpenMpiDemux()
    total = 0
    for _ in range(3500):  # about 100 MB of output
        for event in demux.feed(one):
            assert isinstance(event, Piece)
            total += len(event.data)
    assert total == 3500 * 10 * CHUNK


def shim(program: list[str], **kw: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "3"}
    return subprocess.Popen(wrap_program(program, sys.executable), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, **kw)  # type: ignore[call-overload]


def read_all(out: bytes, limit: int = PIPE_BUF) -> list[object]:
    demux = RecordParser(whole=limit)
    return demux.feed(out) + demux.flush()


def test_the_shim_passes_output_host_and_exit_code(tmp_path: Path) -> None:
    proc = shim([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'\\x00\\xff\\rp');"
                 "print('e', file=sys.stderr); sys.exit(7)", ":", "-np"])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7 and err == b""
    events = read_all(out)
    assert isinstance(events[0], RankHost) and events[0].rank == 3
    def joined(stream: str) -> bytes:
        return b"".join(e.data for e in events if isinstance(e, Piece) and e.stream == stream)

    assert joined("stdout") == b"\x00\xff\rp" and joined("stderr") == b"e\n"
    assert events[-1] == RankExit(3, "exit 7")


def test_a_missing_program_is_one_line_and_127() -> None:
    proc = shim(["/nonexistent/prog"])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 127
    events = read_all(out)
    assert any(isinstance(e, Piece) and b"cannot run /nonexistent/prog" in e.data for e in events)
    assert RankNotStarted(3, "/nonexistent/prog") in events


def test_the_shim_dies_by_the_programs_signal() -> None:
    proc = shim([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGSEGV and read_all(out)[-1] == RankExit(3, "signal 11")


def test_what_a_rank_leaves_behind_ends_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    daemon = ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
              "        import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "        time.sleep(300)\n    os._exit(0)\nos.wait()\nwhile not os.path.exists("
              f"{str(pidfile)!r}): time.sleep(0.01)\nprint('main done')\n")
    proc = shim([sys.executable, "-c", daemon])
    out, _ = proc.communicate(timeout=30)  # the daemon holds the pipe: this hung before
    assert proc.returncode == 0
    assert b"".join(e.data for e in read_all(out) if isinstance(e, Piece)) == b"main done\n"
    assert not alive(int(pidfile.read_text()))


def test_sigterm_reaches_the_program_and_one_that_ignores_it_is_killed() -> None:
    proc = shim([sys.executable, "-c", "import os, signal, time; signal.signal(signal.SIGTERM, "
                 "signal.SIG_IGN); os.write(1, b'up\\n'); time.sleep(300)"])
    assert proc.stdout is not None
    assert read_all(proc.stdout.readline() + proc.stdout.readline())[1] == Piece(3, "stdout", b"up\n")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_the_shim_keeps_its_records_within_the_limit_it_is_given() -> None:
    program = [sys.executable, "-c", "import os; os.write(1, b'[\\n' * 50000)"]
    sizes = {}
    for limit in (PIPE_BUF, 1 << 20):
        env = {**os.environ, "OMPI_COMM_WORLD_RANK": "3"}
        out = subprocess.run(wrap_program(program, sys.executable, limit), capture_output=True,
                             env=env, timeout=30, check=True).stdout
        lines = out.splitlines(keepends=True)
        assert max(len(line) for line in lines) <= limit
        sizes[limit] = len(lines)
        assert b"".join(e.data for e in read_all(out, limit) if isinstance(e, Piece)) == b"[\n" * 50000
    assert sizes[1 << 20] < sizes[PIPE_BUF] / 10


def test_a_short_write_is_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open MPI's pty returns a short write when a signal interrupts it (the shim's SIGCHLD):
    the rest of the record must follow, or the rank's output is cut."""
    from dtlaunch.agents import rank_shim

    real_write = os.write
    monkeypatch.setattr(rank_shim.os, "write", lambda fd, data: real_write(fd, bytes(data[:100])))
    read, write = os.pipe()
    rank_shim.Shim(["true"], 3, out_fd=write).send("o", b"y" * CHUNK)
    monkeypatch.undo()
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        assert read_all(handle.read()) == [Piece(3, "stdout", b"y" * CHUNK)]


def test_the_argv_word_refuses_what_no_exec_can_carry() -> None:
    with pytest.raises(ValueError):
        encode_argv(["prog", "a\0b"])
    with pytest.raises(ValueError):
        encode_argv([])
    for bad in ("", "not base64!", "YQ=", "a" * 5):
        with pytest.raises(ValueError):
            decode_argv(bad)


def test_the_shim_starts_without_the_heavy_modules() -> None:
    # Every rank pays the shim's start before its own: typing, json, base64 and socket (with
    # re behind the first three) cost it 20 ms of CPU per rank, subprocess, contextlib and the
    # signal module's enums 20 ms more, so it does without them.
    argv = list(wrap_program(["/bin/true"], sys.executable))
    argv[1:1] = ["-X", "importtime"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert {"zlib", "select", "_signal"} <= imported  # the measurement sees the shim's imports
    assert not imported & {"typing", "json", "base64", "socket", "subprocess", "contextlib",
                           "signal", "enum", "re"}


@pytest.mark.parametrize("spoil", ["source", "code"])
def test_the_shim_runs_from_byte_code_and_else_from_its_source(spoil: str) -> None:
    # Byte code where the interpreter's bytecode version is dtlaunch's own (compiling the
    # source cost every rank ~5 ms of CPU); the source for any other, or a damaged payload.
    import re

    argv = list(wrap_program(["/bin/sh", "-c", "echo ran; exit 7"], sys.executable))
    payloads = re.findall(r"a2b_base64\('([^']+)'\)", argv[4])
    assert len(payloads) == 2  # the byte code, then the source
    if spoil == "source":  # the byte code alone must run it
        argv[4] = argv[4].replace(payloads[1], "AAAA")
    else:  # another bytecode version: the source must run it
        argv[4] = re.sub(r"==b'[^']*' and ", "==b'none' and ", argv[4])
        assert "==b'none' and " in argv[4]
        argv[4] = argv[4].replace(payloads[0], "AAAA")
    done = subprocess.run(argv, capture_output=True, timeout=60,
                          env={**os.environ, "OMPI_COMM_WORLD_RANK": "3"})
    events = read_all(done.stdout)
    assert b"".join(e.data for e in events if isinstance(e, Piece)) == b"ran\n"
    assert [e.how for e in events if isinstance(e, RankExit)] == ["exit 7"]


def test_the_shims_byte_code_is_the_import_systems_not_compiled_per_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiling the shim's source again for every job cost dtlaunch ~6 ms; the .pyc the import
    # system already holds is the same code.
    import marshal

    from dtlaunch.agents import rank_shim

    def no_compile(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(rank_shim, "compile", no_compile, raising=False)
    code = marshal.loads(rank_shim._byte_code(b""))
    assert code.co_filename == rank_shim.__file__
    assert "wrap_program" in code.co_names


def test_an_optimising_interpreter_compiles_the_shim_unoptimised() -> None:
    # python -O's .pyc has lost the asserts: the ranks get the source's own code instead.
    probe = ("import marshal,sys;from dtlaunch.agents import rank_shim as r;"
             "c=marshal.loads(r._byte_code(open(r.__file__,'rb').read()));"
             "sys.stdout.write(c.co_filename)")
    done = subprocess.run([sys.executable, "-O", "-c", probe], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "<string>"
