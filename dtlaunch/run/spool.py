"""mpirun's stdout and stderr go to spool files that dtlaunch reads as they grow.

Why not pipes: Open MPI's mpirun writes its output non-blocking and queues what a full pipe
does not take; when the job ends it writes that queue once more and drops what still does
not fit. With a reader slower than the ranks (a terminal, or dtlaunch under load) the end of
a remote rank's output was lost: 50 MB printed on another host arrived as 19 to 50 MB. A
regular file never refuses a write, so nothing is queued and nothing is lost.

Bounded: the part already read is given back to the file system (hole punching) every few
megabytes, so the spool takes little disk or tmpfs memory however much the job prints; where
that is not supported it is only as large as the job's output, and it has no name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable

READ_SIZE = 1 << 18  # fewer, larger reads: the cost per read is Python's
PUNCH_EVERY = 8 << 20  # bytes read between two releases of the space they took
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
POLL = 0.02  # seconds between looks at a spool that has not grown


def _punch(fd: int, length: int) -> bool:
    import ctypes  # here: only a job that prints megabytes needs it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flags = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        return int(libc.fallocate(fd, flags, ctypes.c_long(0), ctypes.c_long(length))) == 0
    except (OSError, AttributeError):
        return False


class Spool:
    """An unnamed file: the launcher writes it (`fd`, append-only), `pump` reads it."""

    def __init__(self) -> None:
        handle = tempfile.TemporaryFile(prefix="dtlaunch-")  # noqa: SIM115
        self.read_fd = os.dup(handle.fileno())
        handle.close()
        # A second open file description with O_APPEND for the writers (mpirun, its ssh
        # children): their writes never overwrite each other, and reading keeps its own offset.
        self.fd = os.open(f"/proc/self/fd/{self.read_fd}", os.O_WRONLY | os.O_APPEND)
        self.punch = True

    def pump(self, sink: Callable[[bytes], None], writers_done: threading.Event) -> None:
        """Pass on what is written as it comes, until the writers are done and all is read."""
        offset = released = 0
        while True:
            data = os.pread(self.read_fd, READ_SIZE, offset)
            if data:
                offset += len(data)
                sink(data)
                if self.punch and offset - released >= PUNCH_EVERY:
                    self.punch = _punch(self.read_fd, offset)
                    released = offset
                continue
            if writers_done.is_set():
                if not os.pread(self.read_fd, 1, offset):
                    return
                continue
            writers_done.wait(POLL)

    def close(self) -> None:
        for fd in (self.fd, self.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
