from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.console.hostfile import HostArgs
from dtlaunch.core.errors import UsageError
from dtlaunch.job.hosts import (
    Host,
    assign_ranks,
    format_hosts,
    parse_hostfile_text,
    parse_hosts,
)


def test_hosts_with_and_without_slots() -> None:
    assert parse_hosts("a:2,b,c.example.com:4") == (Host("a", 2), Host("b", 1), Host("c.example.com", 4))
    assert parse_hosts("10.0.0.1:3") == (Host("10.0.0.1", 3),)


# (what is parsed, the text, what the UsageError says), for -H and for a hostfile.
BAD_HOSTS = [
    *((parse_hosts, spec, message) for spec, message in [
        ("host1:x", "slots must be a positive whole number"),
        (":2", "empty host name"),
        ("host1:0", "at least 1"),
        ("host1:-1", "positive whole number"),
        ("", "empty host list"),
        ("a,,b", "empty host entry"),
        ("a:1,a:2", "listed more than once"),
        ("fe80::1", "IPv6"),
        ("[::1]:2", "IPv6"),
        ("a:99999999", "more than"),
        ("bad name", "invalid host name"),
        ("-oProxyCommand=x", "invalid host name"),
        ("user@host", "invalid host name"),
    ]),
    *((parse_hostfile_text, text, message) for text, message in [
        ("node1\nnode2 slots=x\n", "hostfile:2: slots must"),
        ("node1 cores=4\n", "hostfile:1: unexpected 'cores=4'"),
        ("# only comments\n\n", "no hosts"),
        ("n1:2 slots=3\n", "not both"),
        ("n1\nn1\n", "more than once"),
    ]),
]


@pytest.mark.parametrize(("parse", "text", "message"), BAD_HOSTS)
def test_bad_host_specs_and_hostfiles(parse: Callable[[str], object], text: str,
                                      message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse(text)


def test_hostfile_formats() -> None:
    text = "# cluster\n\nnode1 slots=4  # big\nnode2:2\nnode3\nnode4 slots=2 max_slots=8\n"
    assert parse_hostfile_text(text) == (
        Host("node1", 4), Host("node2", 2), Host("node3", 1), Host("node4", 2),
    )


def test_read_hostfile_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        HostArgs(hostfile=str(tmp_path / "missing")).read_hosts()
    binary = tmp_path / "bin"
    binary.write_bytes(b"node1\n\xff\xfe\n")
    with pytest.raises(UsageError, match=r"bin:2: not valid UTF-8"):
        HostArgs(hostfile=str(binary)).read_hosts()
    huge = tmp_path / "huge"
    huge.write_bytes(b"a\n" * (1 << 20))
    with pytest.raises(UsageError, match="larger than 1 MiB"):
        HostArgs(hostfile=str(huge)).read_hosts()


def test_assign_ranks_fills_slots_in_order() -> None:
    hosts = (Host("a", 2), Host("b", 1))
    assert assign_ranks(hosts, 3) == ("a", "a", "b")
    assert assign_ranks(hosts, 5) == ("a", "a", "b", "a", "a")  # oversubscribed wrap


@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.integers(1, 40))
def test_assign_ranks_is_the_slot_order_wrapped(slots: list[int], num_proc: int) -> None:
    hosts = tuple(Host(f"h{i}", n) for i, n in enumerate(slots))
    order = [h.name for h in hosts for _ in range(h.slots)]
    assert assign_ranks(hosts, num_proc) == tuple(order[i % len(order)] for i in range(num_proc))


def test_assign_ranks_lists_only_the_slots_that_get_a_rank() -> None:
    """A hostfile of many big hosts with -np 1 must not list every slot (it took seconds and
    hundreds of MB for 20,000 hosts)."""
    import tracemalloc

    hosts = tuple(Host(f"h{i}", 4096) for i in range(2000))
    tracemalloc.start()
    try:
        assert assign_ranks(hosts, 2) == ("h0", "h0")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


names = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)


@given(st.lists(st.tuples(names, st.integers(1, 64)), min_size=1, max_size=8, unique_by=lambda t: t[0]))
def test_hosts_round_trip(items: list[tuple[str, int]]) -> None:
    hosts = tuple(Host(n, s) for n, s in items)
    assert parse_hosts(format_hosts(hosts)) == hosts
    text = "\n".join(f"{h.name} slots={h.slots}" for h in hosts)
    assert parse_hostfile_text(text) == hosts


@given(st.text(max_size=40))
def test_parsers_never_crash(text: str) -> None:
    for parse in (parse_hosts, parse_hostfile_text):
        try:
            parse(text)
        except UsageError as exc:
            assert "\n" not in str(exc)


def test_a_fifo_given_as_hostfile_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "hosts.fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"^--hostfile: .*hosts.fifo is a FIFO, not a regular file$"):
        HostArgs(hostfile=str(fifo)).read_hosts()
