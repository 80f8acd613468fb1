"""Where an elastic job's hosts come from: horovodrun's discovery script, run within a time
limit, its output read strictly (`parse_hosts` is pure), or the fixed `-H` hosts.

The script is run as a program (its words split as a shell would, but no shell runs): it prints
one host a line, `HOST:SLOTS`, or `HOST` alone with `--slots-per-host`. Empty output means no
host is available right now.
"""

from __future__ import annotations

import shlex
import subprocess

from dtlaunch.core.bounded import run_bounded_apart
from dtlaunch.core.errors import DtlaunchError
from dtlaunch.job.hosts import MAX_SLOTS

MAX_OUTPUT = 1 << 20
_HOST_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


class DiscoveryError(DtlaunchError):
    """The script failed or printed something that is not a host list: one line says which."""


def parse_hosts(text: str, slots_per_host: int | None) -> dict[str, int]:
    """HOST -> slots, in the order the script printed them."""
    found: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        host, sep, slots_text = line.partition(":")
        if not host or not _HOST_CHARS.issuperset(host) or host.startswith(("-", ".")):
            raise DiscoveryError(f"line {number} is not a host: {_shown(line)} (expected "
                                 "HOST:SLOTS or HOST, one a line)")
        if sep:
            # ASCII digits only: isdigit() is also true of '²', which int() refuses.
            if not (slots_text.isascii() and slots_text.isdigit()) \
                    or not slots_text.strip("0"):
                raise DiscoveryError(f"line {number}: {_shown(line)}: the slots after ':' must "
                                     "be a whole number of at least 1")
            digits = slots_text.lstrip("0")
            if len(digits) > len(str(MAX_SLOTS)) or int(digits) > MAX_SLOTS:
                shown = digits if len(digits) <= 20 else f"{digits[:8]}...({len(digits)} digits)"
                raise DiscoveryError(f"line {number}: {_shown(line)}: {shown} "
                                     f"slots is more than the {MAX_SLOTS} dtlaunch accepts")
            slots = int(slots_text)
        elif slots_per_host is None:
            raise DiscoveryError(f"line {number}: host {host} has no slots: print HOST:SLOTS, "
                                 "or give --slots-per-host N")
        else:
            slots = slots_per_host
        found[host] = slots
    return found


def _shown(line: str) -> str:
    return repr(line if len(line) <= 80 else line[:77] + "...")


def run_script(script: str, timeout: float) -> str:
    """The script's standard output; DiscoveryError if it cannot run, fails, prints too much
    or runs longer than `timeout` (its whole session is ended then)."""
    try:
        argv = shlex.split(script)
    except ValueError as exc:
        raise DiscoveryError(f"cannot read the script's command {script!r}: {exc}") from None
    if not argv:
        raise DiscoveryError("the script's command is empty")
    try:
        # Tied to dtlaunch's life: a script hung when dtlaunch is stopped (SIGTERM, SIGINT,
        # even SIGKILL) is ended with its whole session, not left to PID 1.
        code, out, err = run_bounded_apart(argv, timeout, tied=True)
    except OSError as exc:
        raise DiscoveryError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"{argv[0]} did not finish within {timeout:g} s") from None
    if code != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        how = f"exited with code {code}" if code > 0 else f"was killed by signal {-code}"
        raise DiscoveryError(f"{argv[0]} {how}" + (f": {last[0][:200]}" if last[0] else ""))
    if len(out) > MAX_OUTPUT:
        raise DiscoveryError(f"{argv[0]} printed more than {MAX_OUTPUT} bytes")
    return out.decode(errors="replace")
