"""`-H` and `--hostfile` read into Host values: the hostfile's one reader (dtlaunch.core.textfile),
its text parsed by dtlaunch.job.hosts."""

from __future__ import annotations

from dtlaunch.core.errors import UsageError
from dtlaunch.core.textfile import read_small_text
from dtlaunch.job.hosts import Host, parse_hostfile_text, parse_hosts

# Hostfiles larger than this are not hostfiles (a wrong path to a dataset, say).
MAX_HOSTFILE_BYTES = 1 << 20


def read_hostfile(path: str) -> tuple[Host, ...]:
    """Read and parse a hostfile; every failure is a one-line UsageError."""
    return parse_hostfile_text(read_small_text(path, "--hostfile", MAX_HOSTFILE_BYTES, "a hostfile"),
                               path)


def read_hosts(hosts: str | None, hostfile: str | None) -> tuple[Host, ...]:
    """`--hosts` or `--hostfile` (not both); neither: no hosts (this machine)."""
    if hosts is not None and hostfile is not None:
        raise UsageError("give either --hosts or --hostfile, not both")
    if hostfile is not None:
        return read_hostfile(hostfile)
    if hosts is not None:
        return parse_hosts(hosts)
    return ()
