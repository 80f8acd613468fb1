"""The Gloo store against hostile clients that hold no secret: bytes it cannot read, requests
sent slowly, and many connections from one address."""

from __future__ import annotations

import binascii
import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from helpers.store_http import read_answer

from dtlaunch.agents import gloo_host
from dtlaunch.gloo import rendezvous
from dtlaunch.gloo.rendezvous import Store

SECRET = b"s" * 32


@pytest.fixture
def store() -> Iterator[Store]:
    with contextlib.closing(Store(["127.0.0.1"], SECRET, {"global": 2})) as running:
        running.start()
        yield running


@pytest.fixture
def thread_errors() -> Iterator[list[threading.ExceptHookArgs]]:
    """What any thread raised (a traceback on dtlaunch's console)."""
    found: list[threading.ExceptHookArgs] = []
    before = threading.excepthook
    threading.excepthook = found.append
    yield found
    threading.excepthook = before


def answer(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(raw)
        return conn.recv(100)


@pytest.mark.parametrize("length", [b"\xb2", b"\xd9\xa3", b"\xef\xbc\x91", b"+1", b" "])
def test_a_content_length_that_is_not_ascii_digits_is_400_and_nothing_is_printed(
        store: Store, thread_errors: list[threading.ExceptHookArgs], length: bytes) -> None:
    raw = b"PUT /global/0 HTTP/1.1\r\nContent-Length: " + length + b"\r\n\r\nxx"
    got = answer(store.port, raw)
    assert got.startswith(b"HTTP/1.1 400 "), got  # before: closed, a 14-line traceback
    time.sleep(0.1)
    assert thread_errors == []
    assert [r.why for r in store.refusals] == ["bad Content-Length"]


def test_the_forwarder_takes_only_ascii_digits_too() -> None:
    with pytest.raises(gloo_host.BadRequest):
        fake = FakeConn([b"GET /a/b HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n"])
        gloo_host.read_request(fake, b"")  # type: ignore[arg-type]


class FakeConn:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def recv(self, _n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def settimeout(self, _t: float | None) -> None:
        pass


def test_a_request_sent_a_byte_at_a_time_is_cut_at_its_deadline(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rendezvous, "REQUEST_DEADLINE", 1.5)
    with socket.create_connection(("127.0.0.1", store.port), timeout=10) as conn:
        started = time.monotonic()
        got = b""
        for byte in b"GET /global/0 HTTP/1.1\r\nContent-Length: 0\r\nX-Pad: " + b"a" * 100:
            try:
                conn.sendall(bytes([byte]))
                time.sleep(0.2)  # each byte well within the per-read timeout
            except OSError:
                break
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                got = conn.recv(100)
            conn.setblocking(True)
            if got:
                break
        # Before: served for as long as bytes kept coming (one per read timeout).
        assert got.startswith(b"HTTP/1.1 408 "), got
        assert time.monotonic() - started < 5


def test_many_connections_from_one_address_leave_room_for_the_job(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger holding connections open (slowloris) gets only its share; a host whose
    requests are signed is still served."""
    held = []
    try:
        for _ in range(rendezvous.MAX_CLIENTS + 20):
            conn = socket.create_connection(("127.0.0.1", store.port), timeout=10)
            conn.sendall(b"G")
            held.append(conn)
        time.sleep(0.5)
        # The job's hosts reach the store from other addresses than the stranger's.
        served = signed_get_from(store.port, "127.0.0.2")
        assert served == 404  # before: closed at once (the rank saw 503)
    finally:
        for conn in held:
            conn.close()


def signed_get_from(port: int, source: str) -> int:
    nonce = f"{int(time.time()):x}-".encode() + binascii.hexlify(os.urandom(16))
    mac = gloo_host.request_mac(SECRET, b"GET", b"/global/0", nonce, b"")
    raw = (b"GET /global/0 HTTP/1.1\r\nContent-Length: 0\r\nX-Dtlaunch-Nonce: " + nonce
           + b"\r\nX-Dtlaunch-Auth: " + mac.encode() + b"\r\n\r\n")
    with socket.socket() as conn:
        conn.settimeout(10)
        conn.bind((source, 0))
        conn.connect(("127.0.0.1", port))
        conn.sendall(raw)
        try:
            return read_answer(conn)[0]
        except gloo_host.BadRequest:
            return 503
