"""Small text files named on the command line or by a scheduler: hostfiles, env files, config
files, node files. One reader, so each gets the same limits and the same one-line errors."""

from __future__ import annotations

import os
import stat

from dtlaunch.core.errors import UsageError


def read_small_text(path: str, option: str, limit: int, noun: str) -> str:
    """The file's text, or a one-line UsageError that starts with ``option``.

    Opened without blocking and refused unless it is a regular file, so a FIFO or a device
    given by mistake is named instead of waited on forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{option}: {path} is not a regular file")
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
