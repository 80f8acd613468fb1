"""Where and how to reach a host: OpenSSH's config file and dtlaunch's options, resolved the
way OpenSSH (and so mpirun's ssh) would resolve them; the private keys dtlaunch offers: the
agent's (asked with a timeout), then the files."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import socket
from typing import TYPE_CHECKING, Any

from dtlaunch.core.errors import DtlaunchError
from dtlaunch.reach.target import (
    DEFAULT_KNOWN_HOSTS,
    GLOBAL_KNOWN_HOSTS,
    SshTarget,
    import_paramiko,
)

if TYPE_CHECKING:
    from dtlaunch.reach.ssh_options import SshOptions

DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_rsa")

_MATCH_EXEC = re.compile(r"\s*match\b.*\bexec\b", re.IGNORECASE)


def _given(value: Any) -> str | None:
    """A config value as a string; None where absent or `none` (OpenSSH's word for unset)."""
    return str(value) if value and str(value).strip().lower() != "none" else None


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
    user = entry.get("user") or os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name
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
    return SshTarget(
        alias=alias,
        hostname=str(entry.get("hostname", alias)),
        port=port,
        user=str(user),
        identity_files=tuple(os.path.expanduser(p) for p in dict.fromkeys(identities)),
        identities_only=str(entry.get("identitiesonly", "no")).strip().lower() in ("yes", "true", "1"),
        proxy_command=_given(entry.get("proxycommand")),
        proxy_jump=_given(entry.get("proxyjump")),
        known_hosts_files=tuple(os.path.expanduser(p) for p in known),
        global_known_hosts_files=tuple(os.path.expanduser(p) for p in global_known),
        host_key_alias=entry.get("hostkeyalias"),
        accept_new=options.host_key_policy == "accept-new",
        config_file=options.config_file,
        connect_timeout=float(options.connect_timeout),
    )


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
