"""The private keys dtlaunch offers: the agent's (asked with a timeout), then the files."""

from __future__ import annotations

import os
import socket
from typing import Any

from dtlaunch.reach.target import SshTarget, import_paramiko


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
