"""A head start for a job run again: its launcher starts before dtlaunch has read itself in.

dtlaunch spends ~0.2 s before it can start mpirun: the interpreter, ~100 modules, the command
line, the plan. A user runs the same `dtlaunch run ...` over and over (a test loop, a sweep,
a benchmark), and for the same command line, folder, environment and files the plan is the
same. So a launch remembers what it started (the launcher's argv and environment), keyed by
all of that, and the next identical command starts it first, from `dtlaunch.__main__`, with
only this module and the standard library read in (~40 ms after the command was typed).

Nothing is trusted blindly: dtlaunch then reads its command line and plans the job as it
always does, and `execute` adopts the early launcher only if the plan asks for exactly the
same argv, environment and support files. Anything else (a stale memo: an input changed that
the key did not cover) stops the early launcher at once and starts the planned one. Until it
is adopted the early launcher already runs under the lifeline, so an error, a refusal or a
signal on the way ends it with dtlaunch, as for any job.

When a memo is taken (`memo_of`, as the run is about to start the launcher; `keep` writes it
once the job is over):
a plain `run` (no restarts, no elastic or Gloo job, no Slurm step watch), with `--no-check`
or a pre-flight that passed from its cache with the host keys left to the launcher's ssh.
With a pre-flight, the head start is taken only while that cache entry has a good 30 s of
life left, so the plan that follows is sure to find it too; a full pre-flight always runs
before its job. A memo whose environment would hold a secret-looking variable's value is not
written: values taken from the environment are stored by name only, and the rest are
dtlaunch's own (the ssh options, MCA settings, inline `-x NAME=VALUE`).

Memos live in the private cache directory (dtlaunch.core.private_files), like the pre-flight.
Their key covers: the command line, the folder, the whole environment (hashed), the user, the
interpreter, and the size and times of dtlaunch's own files; the memo also stamps each file the
plan read (every argument that names a file, the ssh files, the launcher, ssh itself) and is
used only while none has changed. `DTLAUNCH_EARLY_START=0` turns it off.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from dtlaunch.core.private_files import read_cached, write_cached, write_private_program

# What this module imports is what a job typed again waits for before its launcher starts:
# only what `subprocess` and `json` need anyway (no `typing`, ~15 ms; no `hashlib`, whose
# OpenSSL costs ~5 ms: blake2b is built into CPython).
try:
    from _blake2 import blake2b
except ImportError:  # not CPython
    from hashlib import blake2b

TYPE_CHECKING = False  # the checkers' name for it
if TYPE_CHECKING:
    from typing import Any


FORMAT = 1
PREFLIGHT_MARGIN = 30.0  # seconds the pre-flight's cache entry must still have to live
MEMO_SECONDS = 86400.0  # a memo older than a day is not used (and is written anew)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Started:
    """A launcher started early: what it was started with, and its handles."""

    __slots__ = ("argv", "env", "lifeline_write", "proc", "spools", "support_files")

    def __init__(self, argv: list[str], env: dict[str, str], support_files: list[list[str]],
                 proc: subprocess.Popen[bytes], spools: tuple[Any, Any], lifeline_write: int):
        self.argv, self.env, self.support_files = argv, env, support_files
        self.proc, self.spools, self.lifeline_write = proc, spools, lifeline_write


_started: Started | None = None
_armed: list[str] | None = None  # the command line whose launch may be remembered


def enabled(environ: Mapping[str, str]) -> bool:
    return environ.get("DTLAUNCH_EARLY_START", "1") != "0"


def spawn(argv: Sequence[str], env: Mapping[str, str], stdin_pipe: bool = False,
          ) -> tuple[subprocess.Popen[bytes], tuple[Any, Any], int]:
    """Start the launcher under the lifeline, its output to spool files, in a session of its
    own: (process, (stdout spool, stderr spool), the lifeline's write end, to keep open for as
    long as the job runs). The one way a job's launcher is started (execute uses it too)."""
    from dtlaunch.agents import guarded_argv
    from dtlaunch.run.spool import Spool

    spools = (Spool(), Spool())
    command, lifeline_read, lifeline_write = guarded_argv(list(argv))
    try:
        proc = subprocess.Popen(
            command,
            env=dict(env),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=spools[0].fd,
            stderr=spools[1].fd,
            start_new_session=True,
            pass_fds=(lifeline_read,),
        )
    except BaseException:
        os.close(lifeline_write)
        for spool in spools:
            spool.close()
        raise
    finally:
        os.close(lifeline_read)
    return proc, spools, lifeline_write


def _package_stamp() -> list[Any]:
    """dtlaunch's own files (size, mtime): an edited or reinstalled dtlaunch plans anew."""
    found: list[Any] = []
    stack = [_PACKAGE]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith((".py", ".sh")):
                    st = entry.stat(follow_symlinks=False)
                    found.append([entry.path, st.st_size, st.st_mtime_ns])
    found.sort()
    return found


def _stamp(path: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns, st.st_ino]


def request_key(args: Sequence[str], environ: Mapping[str, str], cwd: str) -> str:
    material = [FORMAT, sys.executable, list(args), cwd, sorted(environ.items()), os.getuid(),
                os.geteuid(), _package_stamp()]
    return blake2b(json.dumps(material).encode(), digest_size=32).hexdigest()


def named_files(args: Sequence[str], cwd: str) -> list[str]:
    """Every argument (or `--option=VALUE` value) that names a regular file: the hostfile, the
    env file, the config file, the script, ssh's files given on the command line."""
    found = []
    for arg in args:
        for word in (arg, arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else ""):
            if word and not word.startswith("-"):
                path = os.path.join(cwd, os.path.expanduser(word))
                if os.path.isfile(path):
                    found.append(os.path.abspath(path))
    return found


def _memo_name(key: str) -> str:
    return f"early-{key[:40]}.json"


def arm(args: Sequence[str]) -> None:
    """The command line (`dtlaunch`'s own arguments) whose launch `memo_of` may take: set by
    the command line for a plain `run`, never by a library call."""
    global _armed
    _armed = list(args)


def memo_of(argv: Sequence[str], env: Mapping[str, str], support_files: Sequence[tuple[str, str]],
            watched: Sequence[str], preflight_key: str | None,
            environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """What the next identical command may start early (see the module's text), taken as the
    plan stands, before the job can change any file it read; None when this launch is not to
    be remembered. `keep` writes it once the job is over, off the launch's path."""
    from dtlaunch.job.env import looks_secret

    environ = os.environ if environ is None else environ
    if _armed is None or not enabled(environ):
        return None
    env_set = {k: v for k, v in env.items() if environ.get(k) != v}
    if any(looks_secret(k) for k in env_set):
        return None  # a secret's value would be written to disk
    cwd = os.getcwd()
    paths = sorted({*named_files(_armed, cwd), *(os.path.abspath(os.path.expanduser(p))
                                                 for p in watched if p), sys.executable})
    return {"format": FORMAT, "key": request_key(_armed, environ, cwd), "time": time.time(),
            "argv": list(argv),
            "env_from": sorted(k for k, v in env.items() if environ.get(k) == v),
            "env_set": env_set, "support_files": [list(f) for f in support_files],
            "stamps": [_stamp(p) for p in paths], "preflight": preflight_key}


def keep(memo: dict[str, Any], environ: Mapping[str, str] | None = None) -> None:
    """Write `memo` (memo_of), memos past their life removed. Not written: the next run plans
    before it starts, as this one did."""
    write_cached(_memo_name(memo["key"]), json.dumps(memo).encode(),
                 prune_older_than=time.time() - MEMO_SECONDS, environ=environ)


def _preflight_fresh(key: str, environ: Mapping[str, str], now: float) -> bool:
    """The pre-flight's cache entry for `key` still has PREFLIGHT_MARGIN seconds to live."""
    from dtlaunch.doctor.preflight_cache import cached_entry

    if environ.get("DTLAUNCH_PREFLIGHT_CACHE", "1") == "0":
        return False
    return cached_entry(key, now + PREFLIGHT_MARGIN) is not None


def usable_memo(args: Sequence[str], environ: Mapping[str, str], cwd: str,
                now: float) -> dict[str, Any] | None:
    """The memo for this command line, if every condition for using it holds."""
    key = request_key(args, environ, cwd)
    raw = read_cached(_memo_name(key), limit=8 << 20, environ=environ)
    if raw is None:
        return None
    try:
        memo = json.loads(raw)
        fresh = (memo["format"] == FORMAT and memo["key"] == key
                 and 0 <= now - float(memo["time"]) < MEMO_SECONDS)
        stamps_hold = all(_stamp(s[0]) == s for s in memo["stamps"])
        names_here = all(n in environ for n in memo["env_from"])
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if not (fresh and stamps_hold and names_here):
        return None
    if memo["preflight"] is not None and not _preflight_fresh(memo["preflight"], environ, now):
        return None
    return memo  # type: ignore[no-any-return]


def try_start(args: Sequence[str], environ: Mapping[str, str] | None = None) -> bool:
    """Start this command line's launcher now, when a memo allows it. Never raises: any
    trouble leaves the ordinary start to do everything."""
    global _started
    env = os.environ if environ is None else environ
    if not enabled(env) or _started is not None:
        return False
    try:
        memo = usable_memo(args, env, os.getcwd(), time.time())
        if memo is None:
            return False
        for path, text in memo["support_files"]:
            write_private_program(path, text)
        job_env = {**{k: env[k] for k in memo["env_from"]}, **memo["env_set"]}
        proc, spools, lifeline_write = spawn(memo["argv"], job_env)
    except Exception:  # the ordinary path reports what is wrong, in one line
        return False
    _started = Started(list(memo["argv"]), job_env, memo["support_files"], proc, spools,
                       lifeline_write)
    return True


def adopt(argv: Sequence[str], env: Mapping[str, str], support_files: Sequence[tuple[str, str]],
          ) -> Started | None:
    """The early launcher, if it is exactly the planned one (then it is this job's); any other
    is stopped. None: start the planned launcher now."""
    global _started
    started, _started = _started, None
    if started is None:
        return None
    if (started.argv == list(argv) and started.env == dict(env)
            and started.support_files == [list(f) for f in support_files]):
        return started
    _stop(started)
    return None


def abandon() -> None:
    """Stop an early launcher that this run will not use (its pre-flight went another way)."""
    global _started
    started, _started = _started, None
    if started is not None:
        _stop(started)


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher's whole session (local ranks included); remote daemons lose their
    lifeline when the launcher's ssh links close and take their ranks down. Not just its
    process group: Open MPI's plm slurm puts its srun in a group of its own, and after a lost
    node that srun would wait for the node (minutes) after everything else is gone."""
    import signal

    from dtlaunch.agents import session_members

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _stop(started: Started) -> None:
    """Kill the early launcher's whole session (it is ~0.2 s old), then let go of it."""
    kill_session(started.proc)
    started.proc.wait()
    os.close(started.lifeline_write)
    for spool in started.spools:
        spool.close()
