"""Small text files named on the command line or by a scheduler: hostfiles, env files, config
files, node files. One reader, so each gets the same limits and the same one-line errors."""

from __future__ import annotations

import os
import stat

from dtlaunch.core.errors import UsageError


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for an error line: "a directory, not a
    regular file"."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"{kind}, not a regular file"
    return "not a regular file"


def read_small_text(path: str, option: str, limit: int, noun: str) -> str:
    """The file's text, or a one-line UsageError that starts with ``option``.

    Opened without blocking and refused unless it is a regular file, so a FIFO or a device
    given by mistake is named instead of waited on forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):  # before open(), which refuses a directory its own way
                raise UsageError(f"{option}: {path} is {file_kind(mode)}")
            with open(fd, "rb", closefd=False) as handle:
                data = handle.read(limit + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UsageError(f"{option}: {path} is larger than {limit >> 20} MiB; is it really {noun}?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UsageError(f"{option}: {path}:{line}: not valid UTF-8 text") from None
    if "\x00" in text:
        raise UsageError(f"{option}: {path} is a binary file, not {noun}")
    return text


LAUNCHER_FILE_LIMIT = 1 << 20


def read_launcher_file(path: str, noun: str) -> str | None:
    """The text of a file the launcher reads by itself; None when it does not exist or this
    user cannot read it (nor can the launcher, run as this user). One-line UsageError when it
    is not a regular file (a FIFO the launcher would wait on for ever, a directory) or over
    1 MiB (the launcher stops with no hint why)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{path} ({noun}) is {file_kind(info.st_mode)}; the MPI launcher "
                             "cannot use it: remove it or make it a regular file")
        if info.st_size > LAUNCHER_FILE_LIMIT:
            raise UsageError(f"{path} ({noun}) is larger than {LAUNCHER_FILE_LIMIT >> 20} MiB; "
                             "the MPI launcher cannot use it")
        data = os.read(fd, LAUNCHER_FILE_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")
