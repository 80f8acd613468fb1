"""One host as ssh reaches it (SshTarget, what ssh_config resolves), and paramiko imported the
one way dtlaunch imports it: the data the rest of reach/ and ssh.py share, importing nothing of
dtlaunch."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")

_import_lock = threading.Lock()


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
