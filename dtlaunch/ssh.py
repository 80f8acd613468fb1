"""SSH connections for doctor and the run pre-flight: paramiko, never a prompt, always a timeout.

One connection per host, made the way OpenSSH (and so mpirun) would make it: the ssh config file
is honoured (HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyCommand, ProxyJump,
UserKnownHostsFile, HostKeyAlias), host keys are checked against known_hosts, and only public
keys are offered (no passwords, no keyboard-interactive). Every failure becomes an `SshFailure`
of a named kind with its own fix.

ProxyCommand is split like a shell would split it and run without a shell (write
`sh -c '...'` in the config when shell syntax is needed); its standard input and output are one
end of a socket pair, so paramiko reads it like any socket and the proxy's end of file is seen.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dtlaunch.errors import DtlaunchError
from dtlaunch.report import ssh_failed
from dtlaunch.ssh_options import SshOptions

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

DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_rsa")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")

# Curve25519 first: its key exchange is the cheapest paramiko offers (C-backed).
KEX_PREFERENCE = ("curve25519-sha256@libssh.org", "curve25519-sha256")

_known_hosts_lock = threading.Lock()
_import_lock = threading.Lock()
_MATCH_EXEC = re.compile(r"\s*match\b.*\bexec\b", re.IGNORECASE)
_live_proxies: set[_ProxySocket] = set()
_live_lock = threading.Lock()


class SshFailure(DtlaunchError):
    """A connection that could not be made: the kind of failure, and the failed ssh check
    (what happened and how to fix it) that reports it."""

    def __init__(self, kind: str, detail: str, hint: str) -> None:
        super().__init__(f"{detail}; {hint}" if hint else detail)
        self.kind = kind
        self.check = ssh_failed(detail, hint)

    @property
    def detail(self) -> str:
        return self.check.detail

    @property
    def hint(self) -> str:
        return self.check.hint


@dataclass(frozen=True)
class SshTarget:
    """Where and how to connect to one host, after ssh config and command-line options."""

    alias: str  # the name as given to dtlaunch (and to mpirun)
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    proxy_command: str | None = None
    proxy_jump: str | None = None
    known_hosts_files: tuple[str, ...] = DEFAULT_KNOWN_HOSTS
    global_known_hosts_files: tuple[str, ...] = GLOBAL_KNOWN_HOSTS
    host_key_alias: str | None = None
    accept_new: bool = False
    config_file: str | None = None
    connect_timeout: float = 10.0

    @property
    def known_hosts_name(self) -> str:
        """The name a known_hosts line carries: `host` on port 22, `[host]:port` otherwise."""
        name = self.host_key_alias or self.hostname
        return name if self.port == 22 else f"[{name}]:{self.port}"

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.alias}"

    def ssh_flags(self) -> tuple[str, ...]:
        """`-p PORT` for the fixes we print, when the port is not the default."""
        return ("-p", str(self.port)) if self.port != 22 else ()


def _yes(value: Any) -> bool:
    return str(value).strip().lower() in ("yes", "true", "1")


def import_paramiko() -> Any:
    """paramiko costs ~0.1 s to import: only where a connection is made. It is imported
    without `invoke`, which its config module imports (~60 ms, a third of paramiko's import)
    only to run `Match exec` lines; `load_ssh_config` supplies it when a config has one."""
    with _import_lock:  # held even when imported, so no thread sees a half-imported module
        blocked = "paramiko" not in sys.modules and "invoke" not in sys.modules
        if blocked:
            sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails fast
        try:
            import paramiko
        finally:
            if blocked and sys.modules.get("invoke", False) is None:
                del sys.modules["invoke"]
    return paramiko


def _needs_match_exec(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return any(_MATCH_EXEC.match(line) for line in handle)
    except OSError:
        return False


def load_ssh_config(path: str | None) -> Any:
    """Parse the OpenSSH config (`--ssh-config` or ~/.ssh/config); a missing default is empty."""
    paramiko = import_paramiko()

    chosen = path or os.path.expanduser("~/.ssh/config")
    if path is None and not os.path.isfile(chosen):
        return paramiko.SSHConfig()
    if paramiko.config.invoke is None and _needs_match_exec(chosen):
        with contextlib.suppress(ImportError):
            import invoke

            paramiko.config.invoke = invoke
    try:
        return paramiko.SSHConfig.from_path(chosen)
    except (OSError, ValueError, paramiko.ConfigParseError) as exc:
        raise DtlaunchError(f"cannot read ssh config {chosen}: {exc}") from None


def resolve_target(alias: str, options: SshOptions, config: Any) -> SshTarget:
    """Apply ssh config (`config.lookup`) and dtlaunch's options, as OpenSSH would."""
    entry: dict[str, Any] = dict(config.lookup(alias)) if config is not None else {}
    user = entry.get("user") or os.environ.get("USER") or _login_name()
    port = options.port if options.port is not None else int(entry.get("port", 22))
    identities: list[str] = []
    if options.identity_file:
        identities.append(options.identity_file)
    identities += [str(p) for p in entry.get("identityfile", [])]
    if not identities:
        identities = [f"~/.ssh/{name}" for name in DEFAULT_IDENTITIES]
    known = str(entry.get("userknownhostsfile", "")).split() or list(DEFAULT_KNOWN_HOSTS)
    global_known = (str(entry.get("globalknownhostsfile", "")).split()
                    or list(GLOBAL_KNOWN_HOSTS))
    proxy_command = entry.get("proxycommand")
    if proxy_command is not None and str(proxy_command).strip().lower() == "none":
        proxy_command = None
    proxy_jump = entry.get("proxyjump")
    if proxy_jump is not None and str(proxy_jump).strip().lower() == "none":
        proxy_jump = None
    return SshTarget(
        alias=alias,
        hostname=str(entry.get("hostname", alias)),
        port=port,
        user=str(user),
        identity_files=tuple(os.path.expanduser(p) for p in dict.fromkeys(identities)),
        identities_only=_yes(entry.get("identitiesonly", "no")),
        proxy_command=str(proxy_command) if proxy_command else None,
        proxy_jump=str(proxy_jump) if proxy_jump else None,
        known_hosts_files=tuple(os.path.expanduser(p) for p in known),
        global_known_hosts_files=tuple(os.path.expanduser(p) for p in global_known),
        host_key_alias=entry.get("hostkeyalias"),
        accept_new=options.host_key_policy == "accept-new",
        config_file=options.config_file,
        connect_timeout=float(options.connect_timeout),
    )


def _login_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


# --- fixes --------------------------------------------------------------------------------------


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


# --- sockets and proxies ------------------------------------------------------------------------


class _ProxySocket:
    """A ProxyCommand/ProxyJump child whose stdin and stdout are one end of a socket pair."""

    def __init__(self, argv: Sequence[str]) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                list(argv), stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C is handled by us; we end the proxy ourselves
            )
        except OSError:
            ours.close()
            theirs.close()
            raise
        theirs.close()
        self.sock = ours
        with _live_lock:
            _live_proxies.add(self)

    def stderr_tail(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return ""
        try:
            data: bytes = self.process.stderr.read()
            return data.decode(errors="replace").strip()[-300:]
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        with _live_lock:
            _live_proxies.discard(self)
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


def close_all_proxies() -> None:
    """Ctrl-C: end every proxy child still running, so nothing is left behind."""
    with _live_lock:
        proxies = list(_live_proxies)
    for proxy in proxies:
        proxy.close()


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


def open_socket(target: SshTarget, timeout: float) -> tuple[socket.socket, _ProxySocket | None]:
    argv = proxy_argv(target)
    if argv is not None:
        try:
            proxy = _ProxySocket(argv)
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


# --- known hosts --------------------------------------------------------------------------------


def _rsa_family(name: str) -> str:
    return "ssh-rsa" if name in ("ssh-rsa", "rsa-sha2-256", "rsa-sha2-512") else name


def known_keys(target: SshTarget) -> dict[str, Any]:
    """Key type -> key recorded for this host in the user and global known_hosts files."""
    paramiko = import_paramiko()

    found: dict[str, Any] = {}
    for path in (*target.known_hosts_files, *target.global_known_hosts_files):
        if not os.path.isfile(path):
            continue
        keys = paramiko.HostKeys()
        try:
            keys.load(path)
        except (OSError, paramiko.SSHException, ValueError):
            continue
        entry = keys.lookup(target.known_hosts_name)
        if entry is None:
            continue
        for key_type in entry:
            found.setdefault(key_type, entry[key_type])
    return found


def preferred_host_key_types(known: dict[str, Any], available: Sequence[str]) -> tuple[str, ...]:
    """Ask first for the key types already recorded, as OpenSSH does, so a host with several
    keys is not mistaken for a changed one."""
    wanted: list[str] = []
    for key_type in known:
        if key_type == "ssh-rsa":
            wanted += ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
        else:
            wanted.append(key_type)
    first = [t for t in wanted if t in available]
    return tuple(dict.fromkeys([*first, *available]))


def check_host_key(target: SshTarget, key: Any, known: dict[str, Any]) -> str:
    """'ok', 'unknown' or 'changed' for the key the server presented."""
    family = _rsa_family(key.get_name())
    if not known:
        return "unknown"
    recorded = known.get(family)
    if recorded is None:
        # Another type is recorded and the server did not offer it: treat as changed.
        return "changed"
    return "ok" if recorded.asbytes() == key.asbytes() else "changed"


def fingerprint(key: Any) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def append_known_host(target: SshTarget, key: Any) -> str:
    """Trust on first use (`--accept-new-host-keys`): append a plain line as OpenSSH does."""
    path = target.known_hosts_files[0] if target.known_hosts_files else os.path.expanduser(
        DEFAULT_KNOWN_HOSTS[0])
    line = f"{target.known_hosts_name} {key.get_name()} {key.get_base64()}\n"
    with _known_hosts_lock:
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as handle:
            if handle.tell() > 0:
                with open(path, "rb") as check:
                    check.seek(-1, os.SEEK_END)
                    if check.read(1) != b"\n":
                        handle.write("\n")
            handle.write(line)
    return path


# --- keys ---------------------------------------------------------------------------------------


def agent_keys(path: str, timeout: float) -> list[Any]:
    """The agent's keys, over a socket with a timeout: paramiko.Agent() would wait forever on
    an agent that accepts and never answers (and so would signing with its keys later)."""
    paramiko = import_paramiko()

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    agent = paramiko.agent.AgentSSH()
    try:
        sock.connect(path)
        agent._connect(sock)
    except BaseException:
        sock.close()
        raise
    return list(agent.get_keys())


def load_identities(target: SshTarget) -> tuple[list[Any], list[str]]:
    """Private keys to offer (agent first unless IdentitiesOnly) and notes on skipped files."""
    paramiko = import_paramiko()

    keys: list[Any] = []
    notes: list[str] = []
    agent_path = os.environ.get("SSH_AUTH_SOCK")
    if not target.identities_only and agent_path:
        try:
            keys += agent_keys(agent_path, target.connect_timeout)
        except (paramiko.SSHException, OSError) as exc:
            notes.append(f"ssh-agent at {agent_path} did not answer: {exc or type(exc).__name__}")
    for path in target.identity_files:
        if not os.path.isfile(path):
            continue
        try:
            keys.append(paramiko.PKey.from_path(path))
        except paramiko.PasswordRequiredException:
            notes.append(f"{path} is protected by a passphrase (load it into ssh-agent)")
        except (paramiko.SSHException, OSError, ValueError) as exc:
            notes.append(f"cannot read {path}: {exc}")
    return keys, notes


# --- connections --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteResult:
    exit_code: int
    stdout: str
    stderr: str


class Connection:
    """One authenticated SSH transport to one host."""

    def __init__(self, target: SshTarget, transport: Any, proxy: _ProxySocket | None,
                 host_key_note: str = "") -> None:
        self.target = target
        self.transport = transport
        self.proxy = proxy
        self.host_key_note = host_key_note

    def run_remote(self, command: str, timeout: float) -> RemoteResult:
        """Run one command (already shell-quoted piece by piece) and collect its output."""
        paramiko = import_paramiko()

        deadline = time.monotonic() + timeout
        try:
            channel = self.transport.open_session(timeout=timeout)
            channel.settimeout(min(1.0, timeout))
            channel.exec_command(command)
            channel.shutdown_write()
            out: list[bytes] = []
            err: list[bytes] = []
            while True:
                if time.monotonic() > deadline:
                    channel.close()
                    raise fail(COMMAND_TIMEOUT, f"the remote command did not finish in "
                               f"{timeout:g} s", self.target)
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
        try:
            self.transport.close()
        finally:
            if self.proxy is not None:
                self.proxy.close()


def _quiet_paramiko() -> None:
    """paramiko logs failed handshakes with tracebacks; dtlaunch reports them itself."""
    import logging

    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def _handshake(target: SshTarget, timeout: float) -> tuple[Any, _ProxySocket | None, str]:
    """TCP (or proxy), key exchange and host key check; no authentication yet."""
    paramiko = import_paramiko()

    _quiet_paramiko()
    start = time.monotonic()
    sock, proxy = open_socket(target, timeout)
    transport: Any = None
    try:
        transport = paramiko.Transport(sock)
        transport.banner_timeout = timeout
        transport.handshake_timeout = timeout
        transport.auth_timeout = timeout
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


def _proxy_or(target: SshTarget, proxy: _ProxySocket | None, kind: str, detail: str) -> SshFailure:
    if proxy is not None and proxy.process.poll() is not None:
        tail = proxy.stderr_tail()
        return fail(PROXY, f"proxy exited with status {proxy.process.returncode}"
                    + (f": {tail}" if tail else ""), target)
    return fail(kind, detail, target)


def _classify_handshake(exc: Exception, target: SshTarget,
                        proxy: _ProxySocket | None) -> SshFailure:
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


def verify_host_key(target: SshTarget, timeout: float | None = None) -> str:
    """Key exchange and host key check only (no login): the cheap check a cache hit keeps."""
    transport, proxy, note = _handshake(target, timeout or target.connect_timeout)
    transport.close()
    if proxy is not None:
        proxy.close()
    return note


def connect(target: SshTarget, timeout: float | None = None) -> Connection:
    """Connect, check the host key, authenticate with keys only. Raises SshFailure."""
    paramiko = import_paramiko()

    timeout = timeout or target.connect_timeout
    transport, proxy, note = _handshake(target, timeout)
    try:
        keys, notes = load_identities(target)
        if not keys:
            why = f" ({'; '.join(notes)})" if notes else ""
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
                return Connection(target, transport, proxy, note)
        extra = f" ({'; '.join(notes)})" if notes else ""
        raise fail(AUTH, f"{target.user}@{target.hostname} refused every key offered "
                   f"({len(keys)})", target, extra)
    except BaseException:
        transport.close()
        if proxy is not None:
            proxy.close()
        raise
