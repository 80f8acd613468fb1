"""Each rank's Gloo contract, from the plan's rank placement. Pure.

Horovod's Gloo controller reads its place in the job from the environment: HOROVOD_RANK,
HOROVOD_SIZE, HOROVOD_LOCAL_RANK/SIZE (on its host), HOROVOD_CROSS_RANK/SIZE (among the
ranks with its local rank, one per host), HOROVOD_HOSTNAME (the name of its host's `local_`
scope in the rendezvous), and HOROVOD_CONTROLLER/CPU_OPERATIONS=gloo. The rendezvous address
and port are set on the host by the host agent (its forwarder's), HOROVOD_GLOO_IFACE per host
from the network the pre-flight chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GlooRank:
    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def env(self, size: int) -> dict[str, str]:
        return {
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_HOSTNAME": self.host,
            "HOROVOD_RANK": str(self.rank),
            "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(self.local_rank),
            "HOROVOD_LOCAL_SIZE": str(self.local_size),
            "HOROVOD_CROSS_RANK": str(self.cross_rank),
            "HOROVOD_CROSS_SIZE": str(self.cross_size),
        }


def place_ranks(rank_hosts: Sequence[str]) -> tuple[GlooRank, ...]:
    """Every rank's place, from the host of each rank (in rank order)."""
    order = list(dict.fromkeys(rank_hosts))
    local_sizes = {h: 0 for h in order}
    local_ranks: list[int] = []
    for host in rank_hosts:
        local_ranks.append(local_sizes[host])
        local_sizes[host] += 1
    out = []
    for rank, host in enumerate(rank_hosts):
        local = local_ranks[rank]
        # Hosts that have a rank with this local rank, in host order.
        peers = [h for h in order if local_sizes[h] > local]
        out.append(GlooRank(rank, host, local, local_sizes[host], peers.index(host), len(peers)))
    return tuple(out)


def scope_sizes(ranks: Sequence[GlooRank]) -> dict[str, int]:
    """How many ranks share each scope Horovod's rendezvous uses (`global`, `local_HOST`,
    `cross_LOCALRANK`): a scope is cleared once all of them are done with it."""
    sizes: dict[str, int] = {"global": len(ranks)}
    for r in ranks:
        sizes[f"local_{r.host}"] = r.local_size
        sizes[f"cross_{r.local_rank}"] = r.cross_size
    return sizes


def host_ifaces(names: Sequence[tuple[str, Sequence[str]]], common: str | None,
                hosts: Sequence[str]) -> dict[str, str]:
    """HOROVOD_GLOO_IFACE for each host: its own interface on the chosen network (names may
    differ between hosts, which one horovodrun value cannot say), else the common one."""
    own = dict(names)
    chosen = {host: own[host][0] if own.get(host) else common for host in hosts}
    return {host: iface for host, iface in chosen.items() if iface}
