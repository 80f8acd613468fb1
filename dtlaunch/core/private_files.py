"""dtlaunch's cache directory, used only when it is private, and files in it handled safely.

A cache root can be shared with other users (a shared XDG_CACHE_HOME, a home on a group-writable
file system), and dtlaunch often runs as root. So the directory is opened once without following
a link at its last step and then used only through that descriptor (a name swapped afterwards
changes nothing), and only if it is this user's own and writable by nobody else. A file is
opened without following links and believed only if it is ours and private. A file is written
as a new one (O_CREAT|O_EXCL|O_NOFOLLOW, unguessable name) renamed over the old: nothing already
in the directory is ever opened for writing.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Mapping


def cache_dir(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dtlaunch")


class NotPrivate(Exception):
    """The directory is not one dtlaunch may keep files in; the message says why and the fix."""


def _why_not_private(path: str, st: os.stat_result, kind: int) -> str | None:
    what = "directory" if kind == stat.S_IFDIR else "file"
    if stat.S_IFMT(st.st_mode) != kind:
        return f"{path} is not a {what}"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or others (chmod 700 it)"
    return None


def open_private_dir(path: str, create: bool = True) -> int:
    """A descriptor of directory `path` (created 0700 when missing), if it is private.

    Raises NotPrivate (a link, another user's, writable by others) or OSError (cannot create or
    open it); FileNotFoundError when it is missing and `create` is False."""
    if create:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        if os.path.islink(path):
            raise NotPrivate(f"{path} is a symbolic link (dtlaunch does not follow it)") from None
        raise
    why = _why_not_private(path, os.fstat(fd), stat.S_IFDIR)
    if why is not None:
        os.close(fd)
        raise NotPrivate(why)
    return fd


@contextlib.contextmanager
def private_dir(path: str, create: bool = True) -> Iterator[int]:
    fd = open_private_dir(path, create)
    try:
        yield fd
    finally:
        os.close(fd)


def read_private(folder: int, name: str, limit: int = 1 << 20) -> bytes | None:
    """The content of `name` in `folder` if it is a private regular file of ours (no link,
    no FIFO), at most `limit` bytes; else None."""
    try:
        # Not blocking: a FIFO in place of a file must not block the read.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    try:
        if _why_not_private(name, os.fstat(fd), stat.S_IFREG) is not None:
            return None
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
        return data if len(data) <= limit else None  # larger than anything dtlaunch writes
    except OSError:
        return None
    finally:
        os.close(fd)


def write_private(folder: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Replace `name` in `folder` with `data` (`mode`) through a new file and a rename."""
    # An unguessable name: os.urandom, as secrets.token_hex takes it (secrets imports hashlib).
    tmp = f".{name}.{os.getpid()}.{os.urandom(8).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                 dir_fd=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def remove_private(folder: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder)


def read_cached(name: str, limit: int = 1 << 20, environ: Mapping[str, str] | None = None,
                ) -> bytes | None:
    """`name` from the private cache directory (read_private), or None when it or the
    directory is absent, unusable or not private: a cache miss, never an error."""
    try:
        with private_dir(cache_dir(environ), create=False) as folder:
            return read_private(folder, name, limit)
    except (OSError, NotPrivate):
        return None


def write_cached(name: str, data: bytes, prune_older_than: float,
                 environ: Mapping[str, str] | None = None) -> None:
    """Write `name` in the private cache directory (created 0700) and remove the files of the
    same kind (the prefix before `name`'s first `-`, and its extension) last written before
    `prune_older_than` (a time): each key writes its own file, and without this the directory
    only grows. An unusable directory is left alone (a cache that cannot be written costs only
    the next run's work)."""
    prefix, suffix = name.split("-", 1)[0] + "-", os.path.splitext(name)[1]
    with contextlib.suppress(OSError, NotPrivate), private_dir(cache_dir(environ)) as folder:
        write_private(folder, name, data)
        for entry in os.listdir(folder):
            if entry.startswith(prefix) and entry.endswith(suffix) and entry != name:
                with contextlib.suppress(OSError):  # another dtlaunch removed it first
                    if os.stat(entry, dir_fd=folder, follow_symlinks=False).st_mtime < prune_older_than:
                        remove_private(folder, entry)


def write_private_program(path: str, text: str) -> None:
    """A small program at `path` that only its owner may change (mode 0700), in a private
    directory: whoever could write there could swap the program dtlaunch runs for every host.
    Kept when it is already there as written, replaced atomically otherwise. Raises NotPrivate
    (the directory is a link, another user's or writable by others) or OSError."""
    folder_path, name = os.path.split(path)
    data = text.encode("utf-8")
    with private_dir(folder_path or ".") as folder:
        if read_private(folder, name) == data:
            return
        write_private(folder, name, data, mode=0o700)
