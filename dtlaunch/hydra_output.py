"""Hydra's `-prepend-rank` output back into whole lines per rank, and its failure messages
read into one precise line. Pure code.

Hydra tags every line a rank writes with `[RANK] ` and every chunk that ends without a newline
too: `print("a", "b")` unbuffered arrives as `[1] a[1]  [1] b\n`. Ranks' stdout reaches
mpiexec's stdout and their stderr its stderr. Hydra's own messages start with `[mpiexec@host]`
or `[proxy:N@host]`, or are its banner lines, and carry no rank tag.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from dtlaunch.failures import Failure
from dtlaunch.output import Line

TAG_RE = re.compile(r"\[(\d+)\] ")


@dataclass
class PrependRankDemux:
    _partial: dict[tuple[int, str], str] = field(default_factory=dict)

    def feed(self, line: str, from_stderr: bool = False) -> list[Line]:
        """Take one line as mpiexec printed it; return the whole lines it completes."""
        stream = "stderr" if from_stderr else "stdout"
        out: list[Line] = []
        first = TAG_RE.match(line)
        if first is None:  # Hydra's own message (a rank's line always starts with its tag)
            if line.strip("\r\n"):
                out.append(Line(None, stream, line.rstrip("\r\n")))
            return out
        pieces = TAG_RE.split(line)
        # split() yields ['', rank, text, rank, text, ...]
        for i in range(1, len(pieces), 2):
            key = (int(pieces[i]), stream)
            buffered = self._partial.pop(key, "") + pieces[i + 1]
            *complete, rest = buffered.split("\n")
            out.extend(Line(key[0], stream, c.rstrip("\r")) for c in complete)
            if rest:
                self._partial[key] = rest
        return out

    def flush(self) -> list[Line]:
        out = [Line(rank, stream, text) for (rank, stream), text in sorted(self._partial.items())]
        self._partial.clear()
        return out


_BAD_TERMINATION = re.compile(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
                              r".*?PID \d+ RUNNING AT (\S+).*?EXIT CODE: (-?\d+)", re.DOTALL)
_EXIT_STRING = re.compile(r"EXIT STRING:.*?\(signal (\d+)\)")
_ABORT = re.compile(r"application called MPI_Abort\(\S*, (-?\d+)\) - process (\d+)")
_EXECVP = re.compile(r"\[proxy:\d+@(\S+)\].*execvp error on file (\S+)")
_SSH_ERR = re.compile(r"^(ssh: .*|.*Permission denied.*|.*Host key verification failed.*)$", re.M)
_PROXY_FAILED = re.compile(r"unable to (?:connect|launch|start)|"
                           r"one of the processes terminated badly|proxy.*(?:failed|error)")


def _only_rank_on(host: str, rank_hosts: Sequence[str]) -> int | None:
    ranks = [r for r, h in enumerate(rank_hosts) if h == host or h.split(".")[0] == host]
    return ranks[0] if len(ranks) == 1 else None


def analyze_hydra(lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None:
    """Find what failed in mpiexec's untagged output.

    Hydra's banner names the host and the exit code (a signal is reported as its number), not
    the rank; the rank is named when it is the host's only one."""
    text = "\n".join(lines)
    abort = _ABORT.search(text)
    if abort:
        rank = int(abort.group(2))
        host = rank_hosts[rank] if 0 <= rank < len(rank_hosts) else None
        return Failure(rank, host, exit_code=int(abort.group(1)), reason="called MPI_Abort")
    bad = _BAD_TERMINATION.search(text)
    if bad:
        host, code = bad.group(1), int(bad.group(2))
        only = _only_rank_on(host, rank_hosts)
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
