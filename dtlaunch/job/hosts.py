"""Parse host lists (`-H h1:2,h2`) and hostfiles' text into Host values. Pure code (a
hostfile is read in dtlaunch.console.hostfile)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dtlaunch.core.errors import UsageError

# Slots per host beyond this are certainly a typo (no machine has a million cores).
MAX_SLOTS = 4096
# More processes than this is a typo, not a job (and would cost gigabytes to plan).
MAX_NUM_PROC = 1_000_000

# RFC 1123 host names (labels of letters, digits, '-' and '_'). `user@host` is not accepted:
# users belong in ssh config, which OpenSSH, mpirun and dtlaunch all read.
_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOSTNAME_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")

# Names that always mean this machine (its own hostname does too, but only a probe knows it).
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})


def local_names() -> frozenset[str]:
    """Names that mean this machine: the loopback ones, and its host name, short and full."""
    import socket  # here, not at the top: a job's start needs none of it

    name = socket.gethostname()
    return LOOPBACK | {name, name.split(".")[0]}


HOSTS_FORMAT = "expected HOST[:SLOTS][,HOST[:SLOTS]...], e.g. host1:2,host2:4"
HOSTFILE_FORMAT = "expected 'HOST', 'HOST slots=N' or 'HOST:N' per line ('#' starts a comment)"


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1
    # False: no slots were written (`h1`, a hostfile line without slots), so 1 stands in
    # until the pre-flight finds NVIDIA GPUs there (dtlaunch.check.gpus: one slot per GPU).
    slots_given: bool = field(default=True, compare=False, repr=False)


def across_machines(hosts: Iterable[Host]) -> bool:
    """Some host is named other than this machine's loopback names: the job may leave it."""
    return any(h.name not in LOOPBACK for h in hosts)


def _parse_slots(text: str, where: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise UsageError(f"{where}: slots must be a positive whole number, got {text!r}")
    slots = int(text)
    if slots < 1:
        raise UsageError(f"{where}: slots must be at least 1, got {slots}")
    if slots > MAX_SLOTS:
        raise UsageError(f"{where}: {slots} slots is more than the {MAX_SLOTS} dtlaunch accepts")
    return slots


def parse_host_entry(entry: str, where: str = "--hosts") -> Host:
    """One `HOST[:SLOTS]` item."""
    entry = entry.strip()
    if not entry:
        raise UsageError(f"{where}: empty host entry; {HOSTS_FORMAT}")
    if entry.count(":") > 1 or entry.startswith("["):
        # Open MPI's -H and hostfile syntax cannot carry IPv6 literals (':' separates slots).
        raise UsageError(f"{where}: IPv6 address {entry!r} is not supported by Open MPI's host "
                         "syntax; give the host a name in ssh config or /etc/hosts")
    name, sep, slots_text = entry.partition(":")
    name = name.strip()
    if not name:
        raise UsageError(f"{where}: empty host name; {HOSTS_FORMAT}")
    if not _HOSTNAME_RE.match(name) or len(name) > 253:  # an IPv4 address is a name of digits
        raise UsageError(f"{where}: invalid host name {name!r}; {HOSTS_FORMAT}")
    slots = _parse_slots(slots_text.strip(), where) if sep else 1
    return Host(name, slots, slots_given=bool(sep))


def merge_duplicates(hosts: Iterable[Host], where: str) -> tuple[Host, ...]:
    """A host named twice is almost always a mistake (mpirun would silently add the slots)."""
    seen: dict[str, Host] = {}
    for host in hosts:
        if host.name in seen:
            raise UsageError(f"{where}: host {host.name!r} is listed more than once")
        seen[host.name] = host
    return tuple(seen.values())


def parse_hosts(spec: str) -> tuple[Host, ...]:
    """Parse `-H host1:2,host2`."""
    if not spec.strip():
        raise UsageError(f"--hosts: empty host list; {HOSTS_FORMAT}")
    return merge_duplicates((parse_host_entry(p) for p in spec.split(",")), "--hosts")


_SLOTS_KV = r"^(slots|max_slots|max-slots)=(.*)$"  # compiled by a hostfile's slots= (re's cache)


def parse_hostfile_text(text: str, path: str = "hostfile") -> tuple[Host, ...]:
    """Open MPI / DeepSpeed hostfiles: `host slots=N`, `host:N`, `host`, comments, blanks."""
    hosts: list[Host] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{lineno}"
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        head, options = fields[0], fields[1:]
        if options and ":" in head:
            raise UsageError(f"{where}: give slots either as HOST:N or slots=N, not both")
        host = parse_host_entry(head, where)
        slots, given = host.slots, host.slots_given
        for option in options:
            match = re.match(_SLOTS_KV, option)
            if not match:
                raise UsageError(f"{where}: unexpected {option!r}; {HOSTFILE_FORMAT}")
            if match.group(1) == "slots":
                slots, given = _parse_slots(match.group(2), where), True
            else:
                _parse_slots(match.group(2), where)  # validated, but max_slots does not add ranks
        hosts.append(Host(host.name, slots, slots_given=given))
    if not hosts:
        raise UsageError(f"{path}: no hosts in hostfile; {HOSTFILE_FORMAT}")
    return merge_duplicates(hosts, path)


def total_slots(hosts: Sequence[Host]) -> int:
    return sum(h.slots for h in hosts)


def assign_ranks(hosts: Sequence[Host], num_proc: int) -> tuple[str, ...]:
    """Host of each rank under `--map-by slot`: fill each host's slots in order, then wrap.

    Wrapping only happens with --oversubscribe; it mirrors Open MPI's round-robin by slot.
    """
    if not hosts or num_proc < 1:
        return ()
    # Only the slots that get a rank are listed (a big hostfile with -np 1 costs nothing).
    wanted = min(num_proc, total_slots(hosts))
    order: list[str] = []
    for host in hosts:
        order.extend([host.name] * min(host.slots, wanted - len(order)))
        if len(order) == wanted:
            break
    return tuple(order[i % len(order)] for i in range(num_proc))


def format_hosts(hosts: Sequence[Host]) -> str:
    """The `-H` argument for mpirun."""
    return ",".join(f"{h.name}:{h.slots}" for h in hosts)
