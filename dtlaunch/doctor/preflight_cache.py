"""The pre-flight's cache: a successful check remembered for five minutes (see preflight.py).

Files live in the user's private cache directory (dtlaunch.core.private_files); the key covers what
the job depends on, and the stamps (size, mtime) of the files whose edit must start over."""

from __future__ import annotations

import json
import math
import os
import time
from typing import TYPE_CHECKING, Any

from dtlaunch.agents import hex_digest
from dtlaunch.core.private_files import (
    NotPrivate,
    cache_dir,
    private_dir,
    read_cached,
    remove_private,
    write_cached,
)

if TYPE_CHECKING:
    from dtlaunch.plan.plan import RunRequest

CACHE_SECONDS = 300.0


def _stamp(path: str | None) -> list[Any]:
    if not path:
        return [None]
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns, st.st_ino]


def checked_program(request: RunRequest) -> tuple[str | None, str | None, str | None]:
    """The interpreter (None: the command names none), script and module the checks look at."""
    program = request.program
    if program is None:
        return request.python, request.script, request.module
    return program.python, program.script, program.module


def cache_key(request: RunRequest, hosts: tuple[str, ...], cwd: str, launcher: str = "",
              job_path: str = "") -> str:
    ssh = request.ssh
    python, script, module = checked_program(request)
    # The files whose edit must start the checks over (None: no such file for this job).
    watched = [ssh.config_file or "~/.ssh/config", ssh.identity_file, "~/.ssh/known_hosts",
               "~/.ssh/known_hosts2", "/etc/ssh/ssh_known_hosts", script, python, launcher or None]
    material = {
        "version": 2,
        "hosts": hosts,
        "python": python,
        "script": os.path.abspath(script) if script else None,
        "module": module,
        "program": list(request.program.argv) if request.program else None,
        "iface": [list(request.iface.names), list(request.iface.cidrs)] if request.iface else None,
        "ssh": [ssh.port, ssh.identity_file, ssh.config_file, ssh.host_key_policy],
        "tree_spawn": request.tree_spawn,
        "controller": request.controller,  # a Gloo job's checks have no MPI in them
        "cwd": cwd,
        "launcher": launcher,  # another MPI first on PATH is another job
        "path": job_path,  # where the hosts find a bare interpreter name
        "uid": os.getuid(),
        "files": [_stamp(p) for p in watched],
    }
    return hex_digest("sha256", json.dumps(material, sort_keys=True, default=str).encode())


def _cache_name(key: str) -> str:
    return f"preflight-{key[:40]}.json"


def cache_problem() -> str | None:
    """Why the cache directory cannot be used (created 0700 when missing), or None."""
    try:
        with private_dir(cache_dir()):
            return None
    except NotPrivate as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot create {cache_dir()}: {exc.strerror or exc}"


def cached_entry(key: str, now: float | None = None) -> dict[str, Any] | None:
    """The fresh cache entry for `key` (with the network chosen then), or None: anything
    unreadable, not private or not what write_cache wrote counts as no entry."""
    raw = read_cached(_cache_name(key))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        written = float(data["time"]) if data["key"] == key else math.nan
    except (ValueError, KeyError, TypeError, IndexError):
        return None  # not what we wrote: check again (and write it anew)
    age = (now if now is not None else time.time()) - written
    return data if 0 <= age < CACHE_SECONDS and isinstance(data, dict) else None


def write_cache(key: str, network: dict[str, Any] | None = None,
                gpus: dict[str, int] | None = None) -> None:
    """Remember a passed pre-flight. The entries that can no longer be used (older than
    CACHE_SECONDS) go at the same time: after a full pre-flight, never on the cached path.
    An unusable directory means no cache, only slower (run_preflight has said why)."""
    data = json.dumps({"key": key, "time": time.time(), "network": network,
                       "gpus": gpus}).encode()
    write_cached(_cache_name(key), data, prune_older_than=time.time() - CACHE_SECONDS)


def drop_cache(key: str) -> None:
    try:
        with private_dir(cache_dir(), create=False) as folder:
            remove_private(folder, _cache_name(key))
    except (OSError, NotPrivate):
        pass
