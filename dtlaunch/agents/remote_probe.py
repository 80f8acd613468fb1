"""The Python half of the probe: the interpreter `run` will use describes itself.

Runs as `python -c <this file's text> SCRIPT MODULE WANT_IMPORTS IMPORT_PROBE_TEXT` (SCRIPT is
checked by the shell half) on any
Python >= 3.6 and prints one JSON document. Versions come from the names of the installed
*.dist-info folders (cheap); what needs a real import (import_probe.py, about a second of
CPU) is computed once per host and cached in `~/.cache/dtlaunch/imports-<key>.json`, keyed by
the interpreter and the installed torch and horovod, so any reinstall recomputes it.

The cache is used only in a directory that is the user's own and writable by nobody else,
reached without following links, and written through a new file (O_EXCL, O_NOFOLLOW) renamed
into place: with a shared or hostile XDG_CACHE_HOME the probe computes, does not cache, and
says why (`cache_problem`, shown by doctor and run as one warning line).
A file lock makes concurrent probes on a shared home directory compute once.
"""

import contextlib
import json
import os
import stat
import sys
from typing import Any, Dict, List, Optional, Tuple

# The word the rest of dtlaunch shares with this agent (through dtlaunch.agents).
__all__ = ["hex_digest"]

Dists = Dict[str, Tuple[str, str]]
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def stamp(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def find_dists(wanted: Tuple[str, ...]) -> Dists:
    """Installed versions from *.dist-info names on sys.path: importlib.metadata costs ~30 ms."""
    found: Dists = {}
    for entry in sys.path:
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            dist, _, version = name.rsplit(".", 1)[0].partition("-")
            key = dist.lower().replace("-", "_")
            if key in wanted and key not in found:
                found[key] = (version.split("-")[0], os.path.join(folder, name))
    return found


def hex_digest(algorithm: str, data: bytes) -> str:
    """hashlib's hex digest ("sha1", "sha256") of `data`, from CPython's own module where it
    has one: hashlib loads OpenSSL, ~5-12 ms of CPU on every host the probe runs on, and on
    every job's start that names a cached file. The same digest, so the caches and names
    written before stay valid."""
    for name in ("_" + algorithm, "_sha2"):  # sha256 is in _sha2 from Python 3.12
        try:
            return getattr(__import__(name), algorithm)(data).hexdigest()  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.new(algorithm, data).hexdigest()


def import_key(dists: Dists) -> str:
    exe = os.path.realpath(sys.executable)
    parts: List[Any] = ["probe-5", sys.executable, exe, stamp(exe), sys.version]
    for name in ("torch", "horovod"):
        version, path = dists.get(name) or (None, None)
        parts.append([name, version, path, stamp(path) if path else None])
        if path:
            package = os.path.join(os.path.dirname(path), name)
            parts.append([package, stamp(package), stamp(os.path.join(package, "torch"))])
    return hex_digest("sha256", json.dumps(parts).encode())[:32]


def compute_imports(code: str) -> Tuple[Dict[str, Any], bool]:
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=120)
    except subprocess.TimeoutExpired:
        return {"torch_error": "importing torch/horovod took more than 120 s"}, False
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1]), True
    except (IndexError, ValueError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"torch_error": f"import crashed (status {done.returncode}): {tail[0]}"}, False


def why_not_private(path: str, st: os.stat_result, kind: int) -> Optional[str]:
    """None when ours, of the expected kind, and writable by no one else; else why not."""
    if stat.S_IFMT(st.st_mode) != kind:
        return path + " is not a " + ("directory" if kind == stat.S_IFDIR else "file")
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or others (chmod 700 it)"
    return None


def open_cache_dir() -> Tuple[Optional[int], str]:
    """A descriptor of ~/.cache/dtlaunch if it is private (created 0700 when missing), or
    None and why not."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "dtlaunch")
    try:
        os.makedirs(base, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        fd = os.open(folder, os.O_RDONLY | DIRECTORY | NOFOLLOW)
    except OSError as e:
        if os.path.islink(folder):
            return None, f"{folder} is a symbolic link (dtlaunch does not follow it)"
        return None, f"cannot open {folder}: {e.strerror or e}"
    why = why_not_private(folder, os.fstat(fd), stat.S_IFDIR)
    if why is None:
        return fd, ""
    os.close(fd)
    return None, why


def read_cached(folder: int, name: str) -> Optional[Dict[str, Any]]:
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=folder)
    except OSError:
        return None
    with os.fdopen(fd) as handle:
        if why_not_private("", os.fstat(fd), stat.S_IFREG) is not None:
            return None
        try:
            data = json.load(handle)
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def write_cached(folder: int, name: str, facts: Dict[str, Any]) -> None:
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=folder)
    with os.fdopen(fd, "w") as handle:
        json.dump(facts, handle)
    os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)


def imports(dists: Dists, code: str) -> Tuple[Dict[str, Any], bool, str]:
    """The import facts, whether they came from the cache, and why no cache was used."""
    folder, problem = open_cache_dir()
    if folder is None:
        return compute_imports(code)[0], False, problem
    name = "imports-" + import_key(dists) + ".json"
    lock = None
    try:
        cached = read_cached(folder, name)
        if cached is not None:
            return cached, True, ""
        with contextlib.suppress(OSError, ImportError):
            import fcntl

            lock = os.open(name + ".lock", os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600,
                           dir_fd=folder)
            fcntl.flock(lock, fcntl.LOCK_EX)
            cached = read_cached(folder, name)
            if cached is not None:
                return cached, True, ""
        facts, keep = compute_imports(code)
        if keep and lock is not None:
            with contextlib.suppress(OSError):  # no cache is only slower
                write_cached(folder, name, facts)
        return facts, False, ""
    finally:
        if lock is not None:
            os.close(lock)
        os.close(folder)


def main() -> None:
    module, want_imports, code = sys.argv[2], sys.argv[3] == "1", sys.argv[4]
    version = ".".join(str(v) for v in sys.version_info[:3])
    out: Dict[str, Any] = {"executable": sys.executable, "version": version}
    dists = find_dists(("torch", "horovod"))
    out.update((dist, dists[dist][0] if dist in dists else None) for dist in ("torch", "horovod"))
    if module:
        import importlib.util

        try:
            out["module_found"] = importlib.util.find_spec(module.split(".")[0]) is not None
        except Exception:
            out["module_found"] = False
    if want_imports:
        try:
            out["imports"], out["cached"], problem = imports(dists, code)
            if problem:
                out["cache_problem"] = problem
        except Exception as e:
            out["imports"] = {"torch_error": f"probe failed: {e}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
