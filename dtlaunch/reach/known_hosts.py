"""known_hosts: what is recorded for a host, the verdict on the key it presents, and
trust on first use (`--accept-new-host-keys`) written the way OpenSSH writes it."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from dtlaunch.reach.target import DEFAULT_KNOWN_HOSTS, SshTarget, import_paramiko

_known_hosts_lock = threading.Lock()


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
    if not known:
        return "unknown"
    name = key.get_name()
    # RSA keys are recorded as ssh-rsa whatever their signature. Another type recorded and the
    # server did not offer it: treat as changed.
    recorded = known.get("ssh-rsa" if name in ("rsa-sha2-256", "rsa-sha2-512") else name)
    return "ok" if recorded is not None and recorded.asbytes() == key.asbytes() else "changed"


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
