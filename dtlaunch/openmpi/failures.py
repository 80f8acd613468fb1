"""Turn mpirun's own messages into one precise line about what failed. Pure code.

Open MPI 3/4 (ORTE) and 5 (PRRTE) word their messages alike but name processes differently:
`[[52439,1],2]` against `[prterun-h1-13381@1,2]`, and PRRTE wraps its lines at other places,
so every pattern allows any whitespace between words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dtlaunch.core.failure import Failure, unknown_option

# A process's name: ORTE's [[jobid,step],vpid] or PRRTE's [nspace@step,vpid].
_NAME = r"\[(?:\[\d+,\d+\]|[^\]\s@]+@\d+),(\d+)\]"
_PROCESS_NAME = re.compile(r"Process name:\s*" + _NAME)
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_SIGNALLED = re.compile(
    r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+(\S+)\s+exited\s+on\s+"
    r"signal\s+(\d+)", re.IGNORECASE
)
_ABORT = re.compile(r"MPI_ABORT\s+was\s+invoked\s+on\s+rank\s+(\d+)\s.*?errorcode\s+(-?\d+)",
                    re.DOTALL)
_LOST_DAEMON = re.compile(r"Remote daemon:\s*" + _NAME + r"\s+on\s+node\s+(\S+)")
_NO_DAEMON = re.compile(r"(?:ORTE|PRTE)\s+was\s+unable\s+to\s+reliably\s+start\s+one\s+or\s+"
                        r"more\s+daemons|PRTE\s+has\s+lost\s+communication|"
                        r"daemon\s+(?:did\s+not|failed\s+to)\s+report\s+back")
# The program (interpreter, script) missing or not executable where a rank was to start:
# "unable to launch the specified application as it could not access or execute an
# executable" (Open MPI 3/4, prterun in 5) and "unable to find the specified executable file".
_NO_EXEC = re.compile(r"unable to (?:launch the specified application|find the specified "
                      r"executable)(?P<body>.*?)(?:^-{20,}|\Z)", re.DOTALL | re.MULTILINE)
_EXEC_NAME = re.compile(r"^\s*Executable:\s*(.+?)\s*$", re.M)
_EXEC_NODE = re.compile(r"^\s*Node:\s*(\S+)", re.M)
_EXEC_RANK = re.compile(r"process\s+rank\s+(\d+)")
_REMOTE_HOST = re.compile(r"^\s*Remote host:\s*(\S+)", re.M)
_SSH_ERR = re.compile(r"^(ssh: .*|.*Permission denied.*|.*Host key verification failed.*)$", re.M)
# An option mpirun does not take: ORTE's one line, PRRTE's box.
_UNKNOWN_OPTION = re.compile(r'unknown\s+option\s+"(?P<orte>[^"]+)"|unrecognized\s+option\s+was\s+'
                             r"included\s+on\s+the\s+\S+\s+command\s+line:\s*Option:\s*(?P<prte>\S+)")

# ORTE's mapper found no free slot on the hosts it may use. With -H hosts that have slots, the
# usual cause is a plm for one machine (plm = isolated, an image's default) set where
# dtlaunch does not look: in an MCA parameter file.
_ALL_FILLED = re.compile(r"All\s+nodes\s+which\s+are\s+allocated\s+for\s+this\s+job\s+are\s+"
                         r"already\s+filled")
ALL_FILLED_REASON = (
    "mpirun found every slot it may use already filled, probably because its launcher is set "
    "to one for a single machine (plm = isolated); 'ompi_info --param plm base --level 2' shows "
    "the value of \"plm\" and where it is set: remove it there")

# PRRTE's (Open MPI 5) words when the plm it is told to use does not exist (plm = isolated
# is ORTE's): the component it looked for is named a few lines before.
_NO_AGENTS = re.compile(r"No\s+available\s+launching\s+agents\s+were\s+found")
_MISSING_PLM = re.compile(r"Framework:\s*plm\s*\n\s*Component:\s*(?P<name>\S+)")


def analyze(lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None:
    """Find the first failing rank in mpirun's untagged output.

    rank_hosts maps rank -> host (from the slot mapping); mpirun's exit-code message names the
    rank but not the host.
    """
    text = "\n".join(lines)
    unknown = _UNKNOWN_OPTION.search(text)
    if unknown:  # nothing started
        return unknown_option("mpirun", unknown.group("orte") or unknown.group("prte"))
    if _ALL_FILLED.search(text):  # nothing started either
        return Failure(reason=ALL_FILLED_REASON)
    if _NO_AGENTS.search(text):  # nor here
        missing = _MISSING_PLM.search(text)
        chosen = f" (plm = {missing.group('name')}, a component it does not have)" if missing else ""
        return Failure(reason=f"mpirun found no launcher it can use{chosen}; 'prte_info --all' shows "
                       "the value of \"plm\": unset it where it is set (--mpi-args, $PRTE_MCA_plm, "
                       "~/.prte/mca-params.conf or the installation's prte-mca-params.conf)")

    def host_of(rank: int) -> str | None:
        return rank_hosts[rank] if 0 <= rank < len(rank_hosts) else None

    # Whichever message comes first names the first failure.
    candidates: list[tuple[int, Failure]] = []
    match = _SIGNALLED.search(text)
    if match:
        candidates.append((match.start(), Failure(int(match.group(1)), match.group(2),
                                                  signal=int(match.group(3)))))
    match = _PROCESS_NAME.search(text)
    if match:
        rank, code = int(match.group(1)), _EXIT_CODE.search(text, match.end())
        candidates.append((match.start(), Failure(rank, host_of(rank),
                                                  exit_code=int(code.group(1)) if code else None)))
    match = _ABORT.search(text)
    if match:
        rank = int(match.group(1))
        candidates.append((match.start(), Failure(rank, host_of(rank), exit_code=int(match.group(2)),
                                                  reason="called MPI_Abort")))
    match = _NO_EXEC.search(text)
    if match:
        candidates.append((match.start(), _missing_program(match.group("body"))))
    if candidates:
        return min(candidates, key=lambda c: c[0])[1]
    lost = _LOST_DAEMON.search(text)
    ssh = _SSH_ERR.search(text)
    if lost and not ssh:
        return Failure(host=lost.group(2), reason=f"lost the connection to host {lost.group(2)}")
    if lost:  # PRRTE reports a daemon that ssh never started as a lost one
        host: str | None = lost.group(2)
    elif _NO_DAEMON.search(text):
        remote = _REMOTE_HOST.search(text)  # PRRTE names the host whose daemon did not report back
        host = remote.group(1) if remote else None
    else:
        return None
    detail = f" ({ssh.group(1).strip()})" if ssh else ""
    if host is None:
        return Failure(reason=f"mpirun could not start its daemon on every host{detail}; run "
                       "'dtlaunch doctor' with the same hosts to see which and why")
    return Failure(host=host, reason=f"mpirun could not start its daemon on host {host}{detail}; "
                   "run 'dtlaunch doctor' with the same hosts to see why")


def _missing_program(body: str) -> Failure:
    """mpirun's own words name the host, the rank and the program that could not start."""
    name, node, rank = _EXEC_NAME.search(body), _EXEC_NODE.search(body), _EXEC_RANK.search(body)
    program = name.group(1) if name else "the program"
    who = f"rank {rank.group(1)}" if rank else "a rank"
    where = f" on host {node.group(1)}" if node else ""
    return Failure(rank=int(rank.group(1)) if rank else None,
                   host=node.group(1) if node else None,
                   reason=f"{who} could not start{where}: {program} was not found or is not "
                          "executable there")
