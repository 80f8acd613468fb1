"""What runs on the hosts (and beside mpirun here): each a file of its own, shipped as it is.

- rank_shim.py: every rank starts as it; it runs the user's program and sends its output as records
- rsh.py: the MPI launcher's ssh agent; says which host's link was lost
- lifeline.py: ends the job when dtlaunch dies, even by SIGKILL
- gloo_start.py: a Gloo job's launcher beside dtlaunch (one agent per host, their output joined)
- gloo_host.py: a Gloo job's agent on each host: starts its ranks, signs their rendezvous requests
- probe.sh, remote_probe.py, import_probe.py: the probe doctor and the pre-flight run on each host
- tied.sh, proxy_tied.sh: a remote command, or a ProxyCommand, tied to the life of its connection

They run under whatever interpreter and shell the host has: the Python files keep to
Python >= 3.6 (no `from __future__ import annotations`, typing's generic aliases) and the
standard library, and import nothing from dtlaunch; the shell files keep to POSIX sh
(tests/test_agents.py holds them to it). This module is the one way the rest of dtlaunch reaches
them: `path` for a file run here, `text` for a file sent to a host, and the few words (record
kinds, environment names, argv builders) each agent defines for itself.
"""

import functools
import importlib
import os
import shutil
from importlib import resources
from typing import TYPE_CHECKING, Any

# The words dtlaunch shares with its agents, defined once in the agent that speaks them. Loaded
# on first use, not here: `python -m dtlaunch.agents.rsh` must find its module not yet imported.
_WORDS = {
    "gloo_host": ("AUTH_HEADER", "NONCE_HEADER", "MAX_BODY", "BadRequest", "read_request",
                  "response_bytes", "request_mac", "response_mac", "gloo_boot_command",
                  "gloo_packed_text"),
    "lifeline": ("guarded_argv", "session_members"),
    "rank_shim": ("ESC", "EXIT", "HEADER_MAX", "HOST", "MAGIC", "NOSTART", "PIPE_BUF", "STDERR",
                  "STDOUT", "encode_argv", "unescape", "wrap_program"),
    "rsh": ("HOST_KEY_PREFIX", "LOST_PREFIX", "SSH_ARGS_ENV"),
}
if TYPE_CHECKING:
    from .gloo_host import (
        AUTH_HEADER,
        MAX_BODY,
        NONCE_HEADER,
        BadRequest,
        gloo_boot_command,
        gloo_packed_text,
        read_request,
        request_mac,
        response_bytes,
        response_mac,
    )
    from .lifeline import guarded_argv, session_members
    from .rank_shim import (
        ESC,
        EXIT,
        HEADER_MAX,
        HOST,
        MAGIC,
        NOSTART,
        PIPE_BUF,
        STDERR,
        STDOUT,
        encode_argv,
        unescape,
        wrap_program,
    )
    from .rsh import HOST_KEY_PREFIX, LOST_PREFIX, SSH_ARGS_ENV


def __getattr__(name: str) -> Any:
    for agent, words in _WORDS.items():
        if name in words:
            return getattr(importlib.import_module(f"{__name__}.{agent}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTH_HEADER",
    "ESC",
    "EXIT",
    "HEADER_MAX",
    "HOST",
    "HOST_KEY_PREFIX",
    "LOCAL_SHELL",
    "LOST_PREFIX",
    "MAGIC",
    "MAX_BODY",
    "NONCE_HEADER",
    "NOSTART",
    "PIPE_BUF",
    "SSH_ARGS_ENV",
    "STDERR",
    "STDOUT",
    "BadRequest",
    "encode_argv",
    "gloo_boot_command",
    "gloo_packed_text",
    "guarded_argv",
    "path",
    "read_request",
    "request_mac",
    "response_bytes",
    "response_mac",
    "session_members",
    "text",
    "unescape",
    "wrap_program",
]

# The shell that runs a shell agent on this machine.
LOCAL_SHELL = "/bin/sh" if os.path.exists("/bin/sh") else (shutil.which("sh") or "sh")


def path(name: str) -> str:
    """The agent `name` as a file on this machine (it is run from there, never copied)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


@functools.cache
def text(name: str) -> str:
    """The agent `name` as the text sent to a host."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
