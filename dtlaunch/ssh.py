"""SSH connections for doctor and the run pre-flight: paramiko, never a prompt, always a timeout.

One connection per host, made the way OpenSSH (and so mpirun) would make it (dtlaunch.reach.ssh_config):
host keys are checked against known_hosts (dtlaunch.reach.known_hosts), and only public keys are
offered (its load_identities), no passwords, no keyboard-interactive. Every failure becomes an
`SshFailure` of a named kind with its own fix (dtlaunch.reach.ssh_errors).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from dtlaunch.core.tracker import Tracker
from dtlaunch.reach.known_hosts import (
    append_known_host,
    check_host_key,
    fingerprint,
    known_keys,
    preferred_host_key_types,
)
from dtlaunch.reach.proxy import ProxySocket, open_socket
from dtlaunch.reach.ssh_config import load_identities
from dtlaunch.reach.ssh_errors import (
    AUTH,
    CHANGED_HOST_KEY,
    COMMAND_TIMEOUT,
    PROTOCOL,
    PROXY,
    TIMEOUT,
    UNKNOWN_HOST_KEY,
    SshFailure,
    classify_os_error,
    fail,
)
from dtlaunch.reach.target import SshTarget, import_paramiko

# Curve25519 first: its key exchange is the cheapest paramiko offers (C-backed).
KEX_PREFERENCE = ("curve25519-sha256@libssh.org", "curve25519-sha256")


@dataclass(frozen=True)
class RemoteResult:
    exit_code: int
    stdout: str
    stderr: str


class Connection:
    """One authenticated SSH transport to one host."""

    def __init__(self, target: SshTarget, transport: Any, proxy: ProxySocket | None,
                 host_key_note: str = "", tracker: Tracker | None = None) -> None:
        self.target = target
        self.transport = transport
        self.proxy = proxy
        self.host_key_note = host_key_note
        self._tracker = tracker
        if tracker is not None:
            tracker.add(self)

    def run_remote(self, command: str, timeout: float,
                   end_mark: bytes | None = None) -> RemoteResult:
        """Run one command (already shell-quoted piece by piece) and collect its output.

        The command's input stays open until the channel closes, so a command tied to it
        (dtlaunch/agents/tied.sh) ends when we give up on it or are stopped. With
        `end_mark`, output is complete once the command has exited and its output holds the
        mark: a process it left behind (its own session, our channel as its output) must not
        keep us waiting for an end of file until the deadline."""
        paramiko = import_paramiko()

        deadline = time.monotonic() + timeout
        try:
            channel = self.transport.open_session(timeout=timeout)
            channel.settimeout(min(1.0, timeout))
            channel.exec_command(command)
            out: list[bytes] = []
            err: list[bytes] = []
            while True:
                if time.monotonic() > deadline:
                    channel.close()
                    raise fail(COMMAND_TIMEOUT, f"the remote command did not finish in "
                               f"{timeout:g} s", self.target)
                if (end_mark is not None and channel.exit_status_ready()
                        and not channel.recv_ready() and end_mark in b"".join(out)):
                    break
                got = False
                while channel.recv_stderr_ready():
                    err.append(channel.recv_stderr(65536))
                    got = True
                try:
                    data = channel.recv(65536)
                except socket.timeout:
                    continue
                if data:
                    out.append(data)
                    continue
                if not got and channel.eof_received:
                    break
            while channel.recv_stderr_ready():
                err.append(channel.recv_stderr(65536))
            remaining = max(0.1, deadline - time.monotonic())
            if not channel.status_event.wait(remaining):
                raise fail(COMMAND_TIMEOUT, "no exit status from the remote command", self.target)
            code = channel.recv_exit_status()
            channel.close()
        except paramiko.SSHException as exc:
            raise fail(PROTOCOL, f"ssh channel failed: {exc}", self.target) from None
        except OSError as exc:
            raise classify_os_error(exc, self.target) from None
        return RemoteResult(code, b"".join(out).decode(errors="replace"),
                            b"".join(err).decode(errors="replace"))

    def close(self) -> None:
        if self._tracker is not None:
            self._tracker.discard(self)
        _close(self.transport, self.proxy)


def _close(transport: Any, proxy: ProxySocket | None) -> None:
    try:
        transport.close()
    finally:
        if proxy is not None:
            proxy.close()


def _quiet_paramiko() -> None:
    """paramiko logs failed handshakes with tracebacks; dtlaunch reports them itself."""
    import logging

    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def _handshake(target: SshTarget, tracker: Tracker | None) -> tuple[Any, ProxySocket | None, str]:
    """TCP (or proxy), key exchange and host key check, within the target's connect timeout;
    no authentication yet."""
    paramiko = import_paramiko()

    _quiet_paramiko()
    timeout = target.connect_timeout
    start = time.monotonic()
    sock, proxy = open_socket(target, timeout, tracker)
    transport: Any = None
    try:
        transport = paramiko.Transport(sock)
        transport.banner_timeout = transport.handshake_timeout = transport.auth_timeout = timeout
        options = transport.get_security_options()
        options.kex = tuple(dict.fromkeys(
            [k for k in KEX_PREFERENCE if k in options.kex] + list(options.kex)))
        known = known_keys(target)
        options.key_types = preferred_host_key_types(known, options.key_types)
        remaining = max(0.5, timeout - (time.monotonic() - start))
        try:
            transport.start_client(timeout=remaining)
        except paramiko.SSHException as exc:
            raise _classify_handshake(exc, target, proxy) from None
        except OSError as exc:
            raise classify_os_error(exc, target) from None
        except EOFError:
            raise _proxy_or(target, proxy, PROTOCOL,
                            f"{target.hostname}:{target.port} closed the connection") from None
        if not transport.initial_kex_done:
            # paramiko returns from start_client at its deadline without raising.
            raise _proxy_or(target, proxy, TIMEOUT,
                            f"{target.hostname}:{target.port} did not complete the SSH handshake "
                            f"within {timeout:g} s")
        key = transport.get_remote_server_key()
        verdict = check_host_key(target, key, known)
        note = ""
        if verdict == "changed":
            raise fail(CHANGED_HOST_KEY, f"the host key of {target.known_hosts_name} has CHANGED "
                       f"(now {key.get_name()} {fingerprint(key)})", target)
        if verdict == "unknown":
            if not target.accept_new:
                raise fail(UNKNOWN_HOST_KEY, f"{target.known_hosts_name} is not in known_hosts "
                           f"({key.get_name()} {fingerprint(key)})", target)
            path = append_known_host(target, key)
            note = f"new host key {fingerprint(key)} added to {path}"
        return transport, proxy, note
    except BaseException:
        if transport is not None:
            transport.close()
        if proxy is not None:
            proxy.close()
        else:
            sock.close()
        raise


def _proxy_or(target: SshTarget, proxy: ProxySocket | None, kind: str, detail: str) -> SshFailure:
    if proxy is not None and proxy.exited():
        tail = proxy.stderr_tail()
        return fail(PROXY, f"proxy exited with status {proxy.process.returncode}"
                    + (f": {tail}" if tail else ""), target)
    return fail(kind, detail, target)


def _classify_handshake(exc: Exception, target: SshTarget,
                        proxy: ProxySocket | None) -> SshFailure:
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, (socket.timeout, TimeoutError)) or "timeout" in text.lower():
        return _proxy_or(target, proxy, TIMEOUT,
                         f"{target.hostname}:{target.port} accepted the connection but sent no SSH "
                         f"greeting within {target.connect_timeout:g} s")
    if "banner" in text.lower():
        return _proxy_or(target, proxy, PROTOCOL,
                         f"{target.hostname}:{target.port} is not an SSH server ({text})")
    return _proxy_or(target, proxy, PROTOCOL, f"SSH negotiation failed: {text}")


def verify_host_key(target: SshTarget, tracker: Tracker | None = None) -> str:
    """Key exchange and host key check only (no login): the cheap check a cache hit keeps."""
    transport, proxy, note = _handshake(target, tracker)
    _close(transport, proxy)
    return note


def connect(target: SshTarget, tracker: Tracker | None = None) -> Connection:
    """Connect, check the host key, authenticate with keys only. Raises SshFailure.
    The connection (and its proxy) stays in `tracker` until closed."""
    paramiko = import_paramiko()

    transport, proxy, note = _handshake(target, tracker)
    try:
        keys, notes = load_identities(target)
        why = f" ({'; '.join(notes)})" if notes else ""
        if not keys:
            raise fail(AUTH, "no private key to offer" + why, target)
        for key in keys:
            try:
                transport.auth_publickey(target.user, key)
            except paramiko.AuthenticationException:
                continue
            except paramiko.SSHException as exc:
                raise fail(PROTOCOL, f"authentication failed: {exc}", target) from None
            except OSError as exc:
                raise classify_os_error(exc, target) from None
            if transport.is_authenticated():
                return Connection(target, transport, proxy, note, tracker)
        raise fail(AUTH, f"{target.user}@{target.hostname} refused every key offered "
                   f"({len(keys)})", target, why)
    except BaseException:
        _close(transport, proxy)
        raise
