"""`--iface`: the network the job's traffic takes, as interface names or CIDR subnets. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dtlaunch.core.errors import UsageError


@dataclass(frozen=True)
class Interfaces:
    """`--iface`: interface names (eth0,ib0) or CIDR subnets (10.0.0.0/24), not a mix."""

    names: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()


_IFNAME_RE = r"^[A-Za-z0-9_.:@-]{1,15}$"  # compiled by --iface (re's cache)
IFACE_FORMAT = "expected interface names (eth0,ib0) or CIDR subnets (10.0.0.0/24)"


def parse_iface(spec: str) -> Interfaces:
    items = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in items):
        raise UsageError(f"--iface: empty entry in {spec!r}; {IFACE_FORMAT}")
    names: list[str] = []
    cidrs: list[str] = []
    for item in items:
        if "/" in item:
            import ipaddress  # only a subnet needs it: every job loads this module

            try:
                net = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise UsageError(f"--iface: invalid CIDR {item!r}; {IFACE_FORMAT}") from None
            if net.version != 4:
                raise UsageError(f"--iface: {item!r}: Open MPI's TCP selection takes IPv4 subnets")
            cidrs.append(str(net))
        elif re.match(_IFNAME_RE, item) and not item.startswith("-"):
            names.append(item)
        else:
            raise UsageError(f"--iface: invalid interface name {item!r}; {IFACE_FORMAT}")
    if names and cidrs:
        raise UsageError("--iface: give either interface names or CIDR subnets, not both")
    return Interfaces(tuple(dict.fromkeys(names)), tuple(dict.fromkeys(cidrs)))
