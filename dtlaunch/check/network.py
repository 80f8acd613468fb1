"""The network a multi-host job uses when no --iface is given. Pure code: judges probe facts.

Open MPI, left alone, tries every interface, and a bridge such as docker0 or virbr0 that
carries the same 172.17.0.1/16 on every host makes it wire ranks to themselves and hang
(horovod #98, #110, #584, #975). The rule, over the IPv4 addresses of interfaces that are up:
1. Leave out loopback and link-local addresses, and any address that two participants share
   (the same 172.17.0.1 on every host is no way to tell hosts apart).
2. The candidates are the subnets on which every participant (each host, and this machine,
   where mpirun's control path starts) has an address left; of nested candidates the
   narrowest is kept.
3. One candidate: it is the network. Several: those carried on some participant by an
   interface named like a host-private bridge (docker*, virbr*, veth*, br-*, cni*, podman*,
   lxcbr*, lxdbr*) are set aside, and if exactly one other remains, it is the network.
4. None, or still several (two real full-mesh networks, say Ethernet and IP over InfiniBand):
   refuse, listing each host's interfaces, with the fix (`--iface`). horovodrun uses every
   common interface at once; dtlaunch does not guess between networks of different speed,
   one of which may not route between the hosts.
The subnet goes to Open MPI (btl_tcp_if_include and oob_tcp_if_include take CIDRs); NCCL and
Gloo take interface names, which may differ between hosts, so each host's names are given too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dtlaunch.job.iface import Interfaces

if TYPE_CHECKING:
    from dtlaunch.check.facts import Iface
    from dtlaunch.check.report import CheckResult, HostOutcome

# The functions that judge import the report model where they run: a job on a cached
# pre-flight reads its NetworkChoice back (choice_from_json) without it or the facts.

HOST_LOCAL_PREFIXES = ("docker", "virbr", "veth", "br-", "cni", "podman", "lxcbr", "lxdbr")
IFACE_FIX = ("pass --iface with the subnet that connects the hosts (e.g. --iface 10.0.0.0/24) "
             "or the interface names (--iface eth0)")

Net = ipaddress.IPv4Network
Addr = tuple[str, ipaddress.IPv4Interface]  # interface name, address with its prefix


@dataclass(frozen=True)
class NetworkChoice:
    """The chosen subnets, or why there are none (`problem` and `fix`)."""

    cidrs: tuple[str, ...] = ()
    names: tuple[tuple[str, tuple[str, ...]], ...] = ()  # host -> its interfaces on them
    nccl_ifname: str | None = None  # NCCL_SOCKET_IFNAME that fits every host, when one does
    gloo_iface: str | None = None  # HOROVOD_GLOO_IFACE, when every host uses the same name
    left_out: tuple[str, ...] = ()  # other shared-looking networks and why they are not used
    problem: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def iface(self) -> Interfaces | None:
        """For RunRequest.iface (Open MPI's include lists); None: nothing was chosen."""
        return Interfaces(cidrs=self.cidrs) if self.cidrs else None

    def env(self) -> tuple[tuple[str, str], ...]:
        """For RunRequest.extra_env."""
        pairs = [("NCCL_SOCKET_IFNAME", self.nccl_ifname), ("HOROVOD_GLOO_IFACE", self.gloo_iface)]
        return tuple((k, v) for k, v in pairs if v)

    def describe(self) -> str:
        if self.problem:
            return f"{self.problem}; {self.fix}"
        hosts = ", ".join(f"{h} {'+'.join(n)}" for h, n in self.names)
        text = f"network: {', '.join(self.cidrs)} ({hosts})"
        return text + (f"; not used: {'; '.join(self.left_out)}" if self.left_out else "")


def _addresses(ifaces: Sequence[Iface]) -> list[Addr]:
    return [(i.name, a) for i in ifaces if i.up for a in i.ipv4()
            if not (a.ip.is_loopback or a.ip.is_link_local or a.ip.is_unspecified)]


def _listing(name: str, ifaces: Sequence[Iface]) -> str:
    shown = [f"{i.name} {' '.join(i.addresses) or '(no address)'}" for i in ifaces
             if i.up and i.name != "lo"]
    return f"{name}: {', '.join(shown) or 'no interface up'}"


def _participants(machines: Mapping[str, Sequence[Iface]]) -> dict[str, list[Addr]]:
    """Each machine once: this machine, or a host listed twice, is told by its address set."""
    found: dict[str, list[Addr]] = {}
    seen: dict[frozenset[str], str] = {}
    for name, ifaces in machines.items():
        addrs = _addresses(ifaces)
        key = frozenset(str(a.ip) for _, a in addrs)
        if key and key in seen:
            continue
        seen[key] = name
        found[name] = addrs
    return found


def _host_local(net: Net, usable: Mapping[str, list[Addr]]) -> list[str]:
    return sorted({n for addrs in usable.values() for n, a in addrs
                   if a.ip in net and n.startswith(HOST_LOCAL_PREFIXES)})


def choose_network(hosts: Mapping[str, Sequence[Iface] | None],
                   local: Sequence[Iface] | None = None) -> NetworkChoice:
    """The network for a job on `hosts` (name -> the probe's interfaces, None if unknown).

    local: this machine's interfaces when it is not one of the hosts (mpirun's control
    path starts there), else None. Fewer than two machines: nothing to choose (no cidrs)."""
    from dtlaunch.check.report import LOCAL

    unknown = [h for h, ifaces in hosts.items() if ifaces is None]
    if unknown:
        return NetworkChoice(problem=f"cannot list the interfaces of {', '.join(unknown)} "
                             "('ip' not found there) to choose a network", fix=IFACE_FIX)
    known = {h: i for h, i in hosts.items() if i is not None}
    everyone = {**known, **({LOCAL.value: local} if local is not None else {})}
    machines = _participants(everyone)
    if len(machines) < 2:
        return NetworkChoice()
    owners: dict[str, set[str]] = {}
    for name, addrs in machines.items():
        for _, addr in addrs:
            owners.setdefault(str(addr.ip), set()).add(name)
    usable = {m: [(n, a) for n, a in addrs if len(owners[str(a.ip)]) == 1]
              for m, addrs in machines.items()}
    left_out = sorted({f"{a.network} ({a.ip} is on {', '.join(sorted(owners[str(a.ip)]))}: {n})"
                       for addrs in machines.values() for n, a in addrs
                       if len(owners[str(a.ip)]) > 1})
    nets = {a.network for addrs in usable.values() for _, a in addrs}
    candidates = [net for net in nets
                  if all(any(a.ip in net for _, a in addrs) for addrs in usable.values())]
    candidates = sorted(c for c in candidates
                        if not any(o != c and o.subnet_of(c) for o in candidates))
    private = {c: _host_local(c, usable) for c in candidates}
    chosen = [c for c in candidates if not private[c]]
    left_out += [f"{c} (on {', '.join(private[c])}, usually private to each host)"
                 for c in candidates if private[c]]
    if len(chosen) != 1:
        if not candidates:
            problem = "no IPv4 network connects every host"
        elif not chosen:
            problem = ("the only networks every host is on are host-private bridges "
                       f"({', '.join(str(c) for c in candidates)})")
        else:
            problem = ("several networks connect every host "
                       f"({', '.join(str(c) for c in chosen)}) and dtlaunch does not guess "
                       "which one the job should use")
        listing = "; ".join(_listing(h, i) for h, i in everyone.items())
        return NetworkChoice(left_out=tuple(left_out), problem=f"{problem} ({listing})",
                             fix=IFACE_FIX)
    return _with_names(chosen[0], owners, known, tuple(left_out))


def _with_names(net: Net, owners: Mapping[str, set[str]], hosts: Mapping[str, Sequence[Iface]],
                left_out: tuple[str, ...]) -> NetworkChoice:
    names = {h: tuple(sorted({n for n, a in _addresses(ifaces)
                              if a.ip in net and len(owners[str(a.ip)]) == 1}))
             for h, ifaces in hosts.items()}
    union = sorted({n for ns in names.values() for n in ns})
    # NCCL takes one list for every host: it must not pick another network on any host.
    clash = any(i.name in union and i.name not in names[h] for h, ifaces in hosts.items()
                for i in ifaces if i.up)
    same = set(names.values())
    gloo = next(iter(same))[0] if len(same) == 1 and len(next(iter(same))) == 1 else None
    return NetworkChoice(
        cidrs=(str(net),),
        names=tuple(names.items()),
        nccl_ifname=None if clash or not union else "=" + ",".join(union),  # '=': exact names
        gloo_iface=gloo,
        left_out=left_out,
    )


def check_network(choice: NetworkChoice) -> CheckResult:
    """The choice as a doctor/pre-flight result (one row for the whole job)."""
    from dtlaunch.check.report import FAIL, PASS, CheckResult

    if choice.problem:
        return CheckResult("network", FAIL, choice.problem, choice.fix)
    return CheckResult("network", PASS, choice.describe() if choice.cidrs else "one machine: "
                       "nothing to choose")


def choose_from_outcomes(outcomes: Sequence[HostOutcome]) -> NetworkChoice | None:
    """choose_network over a doctor run's probes. None when a host has no facts (its SSH
    failure already stops the job) or when no remote host takes part."""
    from dtlaunch.check.report import LOCAL

    if any(o.facts is None for o in outcomes):
        return None
    hosts = {o.host: o.facts.ifaces for o in outcomes if o.facts is not None and o.is_rank_host}
    local = next((o.facts.ifaces for o in outcomes if o.facts is not None
                  and o.role == LOCAL and not o.is_rank_host), None)
    if not any(o.role != LOCAL for o in outcomes):
        return None  # this machine alone: nothing to choose
    return choose_network(hosts, local)


def choice_to_json(choice: NetworkChoice) -> dict[str, Any]:
    return {"cidrs": list(choice.cidrs), "names": [[h, list(n)] for h, n in choice.names],
            "nccl_ifname": choice.nccl_ifname, "gloo_iface": choice.gloo_iface,
            "left_out": list(choice.left_out)}


def choice_from_json(data: Any) -> NetworkChoice | None:
    """A cached choice; None when the data is not what choice_to_json wrote."""
    try:
        choice = NetworkChoice(
            cidrs=tuple(str(c) for c in data["cidrs"]),
            names=tuple((str(h), tuple(str(n) for n in ns)) for h, ns in data["names"]),
            nccl_ifname=None if data["nccl_ifname"] is None else str(data["nccl_ifname"]),
            gloo_iface=None if data["gloo_iface"] is None else str(data["gloo_iface"]),
            left_out=tuple(str(x) for x in data["left_out"]))
        for cidr in choice.cidrs:
            ipaddress.IPv4Network(cidr)
    except (KeyError, TypeError, ValueError):
        return None
    return choice
