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
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise UsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        # Checked before fdopen, which raises IsADirectoryError for a directory.
        os.close(fd)
        raise UsageError(f"{option}: {path} is {file_kind(mode)}")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
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
