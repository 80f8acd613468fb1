"""mpirun's SSH agent: runs ssh, and says so when the link to a host is lost.

Open MPI ignores an ssh link that dies after its daemon started, so a host whose sshd dies
mid-job would leave the job hanging. ssh exits 255 exactly when the connection fails; this
wrapper then prints one line that dtlaunch watches for, and dtlaunch stops the job.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence

LOST_PREFIX = "dtlaunch-rsh: lost the SSH connection to host "
# OpenSSH options that take a value (from ssh(1)); the first other word is the host.
_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")


def find_host(args: Sequence[str]) -> str:
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg.startswith("-") and len(arg) >= 2:
            skip = arg[-1] in _WITH_VALUE and len(arg) == 2
            continue
        return arg
    return "?"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    proc = subprocess.Popen(["ssh", *args])

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    code = proc.wait()
    if code == 255:
        sys.stderr.write(f"{LOST_PREFIX}{find_host(args)} (ssh exit status 255)\n")
        sys.stderr.flush()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
