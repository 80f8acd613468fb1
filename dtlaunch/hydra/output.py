"""Hydra's output back into what each rank's shim sent, and its failure messages read into
one precise line. Pure code.

Every rank runs through dtlaunch.agents.rank_shim, whose records (one line each, escaped, never a
`[`) carry the rank. Hydra's proxies forward what they read in chunks of their own size, so a
record may be cut in two and another rank's chunk may come between the halves; with
`-prepend-rank` Hydra starts every chunk, and every line inside one, with `[RANK] `, which
puts the halves back together: the stream is cut at those tags, each rank's pieces are joined,
and the joined stream is cut into records (dtlaunch.core.records.RecordParser). Untagged lines are
Hydra's own (`[mpiexec@host] ...`, its banner) or dtlaunch's ssh wrapper's.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from dtlaunch.core.failure import Failure, unknown_option
from dtlaunch.core.records import RECORD_LIMIT, RecordParser, TaggedDemux, TagSplitter


class HydraTagSplitter(TagSplitter):
    """Hydra's `-prepend-rank` tags: the rank."""

    TAG = re.compile(rb"\[(\d+)\] ")
    TAG_START = re.compile(rb"\[\d{0,9}\]?\Z")

    def tag(self, match: re.Match[bytes]) -> int:
        return int(match.group(1))


class HydraDemux(TaggedDemux):
    """mpiexec's stdout or stderr (one instance each): tags, then each rank's records."""

    def __init__(self, stream: str = "stdout") -> None:
        # The shim writes records of at most PIPE_BUF bytes here: each is taken whole.
        super().__init__(stream, HydraTagSplitter(),
                         lambda rank: RecordParser(rank, stream, RECORD_LIMIT))


_BAD_TERMINATION = re.compile(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
                              r".*?PID \d+ RUNNING AT (\S+).*?EXIT CODE: (-?\d+)", re.DOTALL)
_EXIT_STRING = re.compile(r"EXIT STRING:.*?\(signal (\d+)\)")
# Intel MPI's banner names the rank and the signal (it has none for a plain exit code).
_INTEL_KILLED = re.compile(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\s*\n=\s*RANK "
                           r"(\d+) PID \d+ RUNNING AT (\S+)\s*\n=\s*KILLED BY SIGNAL: (\d+)")
_ABORT = re.compile(r"application called MPI_Abort\(\S*, (-?\d+)\) - process (\d+)")
_EXECVP = re.compile(r"\[proxy:\d+@(\S+)\].*execvp error on file (\S+)")
_SSH_ERR = re.compile(r"^(ssh: .*|.*Permission denied.*|.*Host key verification failed.*)$", re.M)
# Hydra (MPICH's and Intel MPI's) names a refused option without its dashes.
_UNKNOWN_ARG = re.compile(r"match_arg \(.*?\): unrecognized argument (\S+)")
_PROXY_FAILED = re.compile(r"unable to (?:connect|launch|start)|Unable to run bstrap_proxy|"
                           r"one of the processes terminated badly|proxy.*(?:failed|error)")


def analyze_hydra(lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None:
    """Find what failed in mpiexec's untagged output.

    Hydra's banner names the host and the exit code (a signal is reported as its number), not
    the rank; the rank is named when it is the host's only one."""
    text = "\n".join(lines)
    unknown = _UNKNOWN_ARG.search(text)
    if unknown:  # nothing started
        return unknown_option("mpiexec", "-" + unknown.group(1))
    abort = _ABORT.search(text)
    if abort:
        rank = int(abort.group(2))
        host = rank_hosts[rank] if 0 <= rank < len(rank_hosts) else None
        return Failure(rank, host, exit_code=int(abort.group(1)), reason="called MPI_Abort")
    killed = _INTEL_KILLED.search(text)
    if killed:
        return Failure(int(killed.group(1)), killed.group(2), signal=int(killed.group(3)))
    bad = _BAD_TERMINATION.search(text)
    if bad:
        host, code = bad.group(1), int(bad.group(2))
        ranks = [r for r, h in enumerate(rank_hosts) if h == host or h.split(".")[0] == host]
        only = ranks[0] if len(ranks) == 1 else None  # the rank, when the host's only one
        sig = _EXIT_STRING.search(text, bad.start())
        if sig:
            return Failure(only, host, signal=int(sig.group(1)))
        if code in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            # Hydra prints a killed process's signal number as its exit code.
            who = f"rank {only}" if only is not None else "a process"
            return Failure(only, host, reason=f"{who} on host {host} ended with code {code} "
                           f"(or was killed by signal {code}, {signal.Signals(code).name})")
        return Failure(only, host, exit_code=code)
    execvp = _EXECVP.search(text)
    if execvp:
        return Failure(host=execvp.group(1),
                       reason=f"cannot start {execvp.group(2)} on host {execvp.group(1)}")
    if _PROXY_FAILED.search(text):
        ssh = _SSH_ERR.search(text)
        if ssh:
            return Failure(reason="mpiexec could not start its proxy on every host "
                           f"({ssh.group(1).strip()}); run 'dtlaunch doctor' with the same "
                           "hosts to see which and why")
    return None
