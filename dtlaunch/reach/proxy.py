"""ProxyCommand and ProxyJump: the proxy runs without a shell (split like one would split it;
write `sh -c '...'` in the config when shell syntax is needed), its standard input and output
one end of a socket pair, so paramiko reads it like any socket and sees the proxy's end of file.

A proxy is tracked by the caller's `Tracker` (dtlaunch.probe.prober), not a global registry, so a
prober ends exactly its own on Ctrl-C or at a deadline. It starts under a fixed script
(agents/proxy_tied.sh, its words passed as arguments, never as shell text) that ends it
when a pipe only dtlaunch holds closes: a SIGKILLed dtlaunch leaves no proxy either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence

from dtlaunch.agents import LOCAL_SHELL, moved_clear, ship
from dtlaunch.core.tracker import Tracker
from dtlaunch.reach.ssh_errors import PROXY, classify_os_error, fail
from dtlaunch.reach.target import SshTarget


class ProxySocket:
    """A ProxyCommand/ProxyJump child whose stdin and stdout are one end of a socket pair."""

    def __init__(self, argv: Sequence[str], tracker: Tracker | None = None) -> None:
        self._tracker = tracker
        if shutil.which(argv[0]) is None:  # said as the OS says it, not as the wrapper's sh would
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
        with tracker.opening() if tracker is not None else contextlib.nullcontext():
            ours, theirs = socket.socketpair()
            # The proxy's tie to this process (proxy_tied.sh): a pipe whose write end only we
            # hold, so a SIGKILLed dtlaunch still ends its proxies.
            tie_read, self._tie = os.pipe()
            # proxy_tied.sh uses descriptors 0, 1 and 4 itself, and os.pipe takes the lowest
            # free ones: a descriptor another thread just closed (4) would be overwritten
            # there, the tie would read end of file at once and end the proxy as it starts.
            tie_read = moved_clear(tie_read)
            try:
                self.process = subprocess.Popen(
                    [*ship("proxy_tied.sh").shell(LOCAL_SHELL, "dtlaunch-proxy"), str(tie_read),
                     *argv],
                    stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=subprocess.PIPE,
                    pass_fds=(tie_read,),
                    start_new_session=True,  # Ctrl-C is handled by us; we end the proxy ourselves
                )
            except OSError:
                ours.close()
                os.close(self._tie)
                raise
            finally:
                theirs.close()
                os.close(tie_read)
            self.sock = ours
            if tracker is not None:
                tracker.add(self)

    def exited(self, wait: float = 0.5) -> bool:
        """Whether the proxy has ended; its socket's end of file may come just before."""
        try:
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stderr_tail(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return ""
        try:
            data: bytes = self.process.stderr.read()
            return data.decode(errors="replace").strip()[-300:]
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        if self._tracker is not None:
            self._tracker.discard(self)
        self.sock.close()
        # The proxy runs in its own session: end its whole group (a `sh -c` and its children).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
        with contextlib.suppress(OSError):
            os.close(self._tie)  # the tie's watcher, if still there, ends what is left


def proxy_argv(target: SshTarget) -> tuple[str, ...] | None:
    """The proxy program to run for this target, as an argv (never through a shell)."""
    if target.proxy_command:
        try:
            argv = shlex.split(target.proxy_command)
        except ValueError as exc:
            raise fail(PROXY, f"cannot split ProxyCommand {target.proxy_command!r}: {exc}",
                       target) from None
        return tuple(argv) if argv else None
    if target.proxy_jump:
        jumps = [j.strip() for j in target.proxy_jump.split(",") if j.strip()]
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(target.connect_timeout)}",
                "-o", "StrictHostKeyChecking=" + ("accept-new" if target.accept_new else "yes")]
        if target.config_file:
            argv += ["-F", target.config_file]
        if len(jumps) > 1:
            argv += ["-J", ",".join(jumps[:-1])]
        argv += ["-W", f"[{target.hostname}]:{target.port}", "--", jumps[-1]]
        return tuple(argv)
    return None


def open_socket(target: SshTarget, timeout: float,
                tracker: Tracker | None = None) -> tuple[socket.socket, ProxySocket | None]:
    argv = proxy_argv(target)
    if argv is not None:
        try:
            proxy = ProxySocket(argv, tracker)
        except OSError as exc:
            raise fail(PROXY, f"cannot start proxy {argv[0]!r}: {exc.strerror or exc}",
                       target) from None
        proxy.sock.settimeout(timeout)
        return proxy.sock, proxy
    try:
        sock = socket.create_connection((target.hostname, target.port), timeout=timeout)
    except OSError as exc:
        raise classify_os_error(exc, target) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, None
