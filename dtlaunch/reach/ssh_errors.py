"""SSH failures: the named kinds, and for each one the fix to print. Pure code."""

from __future__ import annotations

import errno
import os
import shlex
import socket
from typing import TYPE_CHECKING

from dtlaunch.core.errors import DtlaunchError

if TYPE_CHECKING:
    from dtlaunch.reach.target import SshTarget

# Failure kinds, each with its own fix.
UNRESOLVED = "unresolved"
REFUSED = "refused"
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
AUTH = "auth"
UNKNOWN_HOST_KEY = "unknown-host-key"
CHANGED_HOST_KEY = "changed-host-key"
PROXY = "proxy"
PROTOCOL = "ssh-error"
COMMAND_TIMEOUT = "command-timeout"


class SshFailure(DtlaunchError):
    """A connection that could not be made: the kind of failure, what happened and how to fix
    it (the prober reports them as the host's failed ssh check)."""

    def __init__(self, kind: str, detail: str, hint: str) -> None:
        super().__init__(f"{detail}; {hint}" if hint else detail)
        self.kind = kind
        self.detail = detail
        self.hint = hint


def hint_for(kind: str, target: SshTarget, extra: str = "") -> str:
    port = f" -p {target.port}" if target.port != 22 else ""
    name = target.alias
    if kind == UNRESOLVED:
        return (f"the name {target.hostname!r} does not resolve: fix DNS or /etc/hosts, or add "
                f"'Host {name}' with 'HostName <address>' to your ssh config")
    if kind == REFUSED:
        return (f"nothing listens on port {target.port} of {target.hostname}: start sshd there "
                f"('systemctl start ssh') or set the right Port for {name} in your ssh config")
    if kind in (TIMEOUT, UNREACHABLE):
        return (f"{target.hostname}:{target.port} did not answer in {target.connect_timeout:g} s: "
                "is the host up, is the address right, does a firewall drop the port? "
                f"try 'ssh -v{port} {name} true'")
    if kind == AUTH:
        pub = next((p + ".pub" for p in target.identity_files
                    if os.path.isfile(p) and os.path.isfile(p + ".pub")), None)
        if pub is None:
            return ("no usable private key: create one with 'ssh-keygen -t ed25519', then install "
                    f"it with 'ssh-copy-id{port} {target.user}@{target.hostname}'")
        return (f"{target.user}@{target.hostname} does not accept your key: install it with "
                f"'ssh-copy-id -i {pub}{port} {target.user}@{target.hostname}'" + extra)
    if kind == UNKNOWN_HOST_KEY:
        return ("verify the fingerprint with the host's administrator (on the host: "
                "'ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub'), then record it with "
                f"'ssh -o StrictHostKeyChecking=accept-new{port} {name} true', "
                "or rerun with --accept-new-host-keys")
    if kind == CHANGED_HOST_KEY:
        files = target.known_hosts_files[0] if target.known_hosts_files else "~/.ssh/known_hosts"
        return ("POSSIBLE MAN-IN-THE-MIDDLE ATTACK: do not connect until you know why the key "
                "changed; if the host was really reinstalled, remove the old key with "
                f"'ssh-keygen -R {shlex.quote(target.known_hosts_name)} -f {files}' and verify "
                "the new fingerprint before trusting it")
    if kind == PROXY:
        return f"the ProxyCommand/ProxyJump for {name} failed; try 'ssh -v{port} {name} true'"
    if kind == COMMAND_TIMEOUT:
        return f"the host accepted SSH but the command did not finish; try 'ssh {name} true'"
    return f"try 'ssh -v{port} {name} true' to see what the server says"


def fail(kind: str, detail: str, target: SshTarget, extra: str = "") -> SshFailure:
    return SshFailure(kind, detail, hint_for(kind, target, extra))


def classify_os_error(exc: BaseException, target: SshTarget) -> SshFailure:
    """Turn a socket-level error into a named failure."""
    where = f"{target.hostname}:{target.port}"
    if isinstance(exc, socket.gaierror):
        return fail(UNRESOLVED, f"cannot resolve {target.hostname}: {exc.strerror or exc}", target)
    if isinstance(exc, ConnectionRefusedError):
        return fail(REFUSED, f"connection refused by {where}", target)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return fail(TIMEOUT, f"no answer from {where} within {target.connect_timeout:g} s", target)
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH,
                                                   errno.EHOSTDOWN):
        return fail(UNREACHABLE, f"{where} is unreachable: {exc.strerror}", target)
    if isinstance(exc, ConnectionResetError):
        return fail(PROTOCOL, f"{where} closed the connection", target)
    return fail(PROTOCOL, f"{where}: {exc}", target)
