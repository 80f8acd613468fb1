"""What a program says of its version (`mpirun --version`, `ssh -V`), asked once per build.

Every `run` asks the local launcher and ssh what they are before it starts mpirun, ~15 ms
of a job's start spent on an answer that changes only when the program does. The answer is
kept in the private cache directory under a name made of the program's identity: its real
path, device, inode, size, modification and change times, the variables that pick its
libraries, and the day. A program replaced, rebuilt or touched is asked again, and so is any
program once a day. A failed answer (an exit status other than 0) is never kept.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence

from dtlaunch.agents import hex_digest
from dtlaunch.core.bounded import run_bounded
from dtlaunch.core.private_files import read_cached, write_cached

# Variables that can change which libraries (and so which version) a program loads.
_LIBRARY_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "OPAL_PREFIX", "I_MPI_ROOT")
_DAY = 86400


def program_key(argv: Sequence[str], environ: Mapping[str, str], now: float) -> str | None:
    """The cache name for asking `argv` (argv[0] a path), or None when it cannot be told
    apart from another build (no such file)."""
    try:
        real = os.path.realpath(argv[0])
        st = os.stat(real)
    except OSError:
        return None
    identity = [list(argv), real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                st.st_ctime_ns, [environ.get(v) for v in _LIBRARY_VARIABLES], int(now // _DAY)]
    return f"version-{hex_digest('sha1', json.dumps(identity).encode())}.txt"


def version_output(argv: Sequence[str], timeout: float, environ: Mapping[str, str] | None = None,
                   ) -> tuple[int, str]:
    """(exit status, stdout and stderr together) of `argv`, from the cache when this build
    of the program was asked before. Raises like run_bounded when it must be asked and cannot."""
    env = os.environ if environ is None else environ
    name = program_key(argv, env, time.time())
    data = read_cached(name, limit=1 << 16, environ=env) if name is not None else None
    if data is not None:
        return 0, data.decode(errors="replace")
    code, out = run_bounded(argv, timeout=timeout)
    if code == 0 and name is not None:
        # Each day's answers have new names: those from before yesterday go.
        write_cached(name, out.encode(), prune_older_than=time.time() - 2 * _DAY, environ=env)
    return code, out
