"""Choosing the network for a multi-host job from the hosts' interfaces (pure)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.check.facts import Iface, parse_ip_output
from dtlaunch.check.host_checks import FAIL, PASS
from dtlaunch.check.network import NetworkChoice, check_network, choose_network
from dtlaunch.mpi import Interfaces

LO = Iface("lo", True, ("127.0.0.1/8", "::1/128"))


def host(*ifaces: Iface) -> tuple[Iface, ...]:
    return (LO, *ifaces)


def docker(address: str = "172.17.0.1/16", up: bool = True) -> Iface:
    return Iface("docker0", up, (address,))


def test_docker0_with_the_same_address_everywhere_is_left_out() -> None:
    hosts = {f"h{i}": host(Iface("eth0", True, (f"10.0.0.1{i}/24", f"fe80::{i}/64")), docker())
             for i in (1, 2, 3)}
    choice = choose_network(hosts)
    assert choice == NetworkChoice(
        cidrs=("10.0.0.0/24",),
        names=(("h1", ("eth0",)), ("h2", ("eth0",)), ("h3", ("eth0",))),
        nccl_ifname="=eth0",
        gloo_iface="eth0",
        left_out=("172.17.0.0/16 (172.17.0.1 is on h1, h2, h3: docker0)",),
    )
    assert choice.iface == Interfaces(cidrs=("10.0.0.0/24",))
    assert check_network(choice).status == PASS
    assert check_network(NetworkChoice()).detail == "one machine: nothing to choose"
    assert choice.env() == (("NCCL_SOCKET_IFNAME", "=eth0"), ("HOROVOD_GLOO_IFACE", "eth0"))
    assert choice.describe() == ("network: 10.0.0.0/24 (h1 eth0, h2 eth0, h3 eth0); not used: "
                                 "172.17.0.0/16 (172.17.0.1 is on h1, h2, h3: docker0)")


def test_names_that_differ_between_hosts() -> None:
    choice = choose_network({"a": host(Iface("eno1", True, ("10.1.0.1/16",))),
                             "b": host(Iface("ens3", True, ("10.1.0.2/16",)))})
    assert choice.cidrs == ("10.1.0.0/16",)
    assert choice.nccl_ifname == "=eno1,ens3" and choice.gloo_iface is None


def test_nccl_names_that_would_pick_another_network_somewhere_are_not_given() -> None:
    choice = choose_network({
        "a": host(Iface("eth1", True, ("10.1.0.1/24",)), Iface("eth0", True, ("192.168.1.5/24",))),
        "b": host(Iface("eth0", True, ("10.1.0.2/24",)), Iface("eth1", True, ("172.20.0.2/24",))),
    })
    assert choice.cidrs == ("10.1.0.0/24",) and choice.nccl_ifname is None
    assert choice.names == (("a", ("eth1",)), ("b", ("eth0",)))


def test_two_real_networks_are_ambiguous() -> None:
    hosts = {h: host(Iface("eth0", True, (f"10.0.0.{i}/24",)), Iface("ib0", True, (f"10.9.0.{i}/24",)))
             for i, h in ((1, "h1"), (2, "h2"))}
    choice = choose_network(hosts)
    assert not choice.ok and choice.cidrs == ()
    assert choice.problem == (
        "several networks connect every host (10.0.0.0/24, 10.9.0.0/24) and dtlaunch does not guess "
        "which one the job should use (h1: eth0 10.0.0.1/24, ib0 10.9.0.1/24; "
        "h2: eth0 10.0.0.2/24, ib0 10.9.0.2/24)")
    assert "--iface 10.0.0.0/24" in choice.fix
    row = check_network(choice)
    assert (row.status, row.detail, row.hint) == (FAIL, choice.problem, choice.fix)
    assert choice.describe().startswith("several networks") and "--iface" in choice.describe()


def test_a_host_private_bridge_with_distinct_addresses_gives_way() -> None:
    choice = choose_network({"h1": host(Iface("eth0", True, ("10.0.0.1/24",)), docker("172.17.0.1/16")),
                             "h2": host(Iface("eth0", True, ("10.0.0.2/24",)), docker("172.17.0.2/16"))})
    assert choice.cidrs == ("10.0.0.0/24",)
    assert choice.left_out == ("172.17.0.0/16 (on docker0, usually private to each host)",)


def test_only_host_private_bridges_in_common_is_refused() -> None:
    choice = choose_network({"h1": host(Iface("eth0", True, ("10.0.0.1/24",)), docker("172.17.0.1/16")),
                             "h2": host(Iface("eth0", True, ("10.5.0.2/24",)), docker("172.17.0.2/16"))})
    assert choice.problem.startswith("the only networks every host is on are host-private bridges "
                                     "(172.17.0.0/16)")


@pytest.mark.parametrize("second", [
    host(Iface("eth0", True, ("10.0.1.2/24",))),  # another subnet
    host(Iface("eth0", False, ("10.0.0.2/24",))),  # down
    host(Iface("eth0", True, ("169.254.3.4/16",))),  # link-local
    host(Iface("eth0", True, ("10.0.0.1/24",))),  # h1's address: shared, so no use
    host(),  # loopback only
])
def test_no_common_network(second: tuple[Iface, ...]) -> None:
    first = host(Iface("eth0", True, ("10.0.0.1/24",)), Iface("wlan0", True, ("192.168.0.9/24",)))
    choice = choose_network({"h1": first, "h2": second})
    assert choice.problem.startswith("no IPv4 network connects every host (h1: eth0 10.0.0.1/24, "
                                     "wlan0 192.168.0.9/24; h2: ")


def test_this_machine_must_be_on_the_network_for_mpirun_control_path() -> None:
    hosts = {"h1": host(Iface("eth0", True, ("10.0.0.11/24",))), "h2": host(Iface("eth0", True, ("10.0.0.12/24",)))}
    bridge = host(Iface("dtb1", True, ("10.0.0.1/24",)), Iface("eth0", True, ("192.168.5.5/24",)))
    assert choose_network(hosts, bridge).cidrs == ("10.0.0.0/24",)
    elsewhere = choose_network(hosts, host(Iface("eth0", True, ("192.168.5.5/24",))))
    assert elsewhere.problem.startswith("no IPv4 network connects every host")
    assert "this machine: eth0 192.168.5.5/24" in elsewhere.problem
    # This machine is one of the hosts: it is not counted twice (its addresses are not "shared").
    assert choose_network(hosts, hosts["h1"]).cidrs == ("10.0.0.0/24",)


def test_nested_prefixes_keep_the_narrowest() -> None:
    choice = choose_network({"a": host(Iface("eth0", True, ("10.0.0.5/24",))),
                             "b": host(Iface("eth0", True, ("10.0.0.6/16",)))})
    assert choice.cidrs == ("10.0.0.0/24",)


def test_nothing_to_choose_or_nothing_known() -> None:
    assert choose_network({"h1": host(Iface("eth0", True, ("10.0.0.1/24",)))}) == NetworkChoice()
    same = host(Iface("eth0", True, ("10.0.0.1/24",)))
    assert choose_network({"localhost": same, "h1": same}) == NetworkChoice()
    unknown = choose_network({"h1": same, "h2": None})
    assert unknown.problem == "cannot list the interfaces of h2 ('ip' not found there) to choose a network"


def test_from_real_ip_output() -> None:
    link = ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 state UNKNOWN\n"
            "2: eth0@if7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 state UP\n"
            "3: docker0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 state UP\n")
    addr = ("1: lo    inet 127.0.0.1/8 scope host lo\n"
            "2: eth0    inet {ip}/24 brd 10.3.4.255 scope global eth0\n"
            "3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\n")
    hosts = {h: parse_ip_output(link, addr.format(ip=ip)) for h, ip in (("h1", "10.3.4.11"), ("h2", "10.3.4.12"))}
    assert choose_network(hosts).cidrs == ("10.3.4.0/24",)


# --- properties ------------------------------------------------------------------------------

NAMES = st.sampled_from(["eth0", "eth1", "eno1", "ens3", "enp1s0", "bond0", "ib0"])


@st.composite
def clusters(draw: st.DrawFn) -> tuple[str, dict[str, tuple[Iface, ...]], Iface | None]:
    """One real subnet every host is on, plus noise that must never be chosen."""
    n = draw(st.integers(2, 6))
    prefix = draw(st.integers(8, 28))
    base = ipaddress.ip_network(f"10.{draw(st.integers(0, 255))}.0.0/{prefix}", strict=False)
    hosts_addr = draw(st.lists(st.integers(1, min(base.num_addresses - 2, 5000)),
                               min_size=n + 1, max_size=n + 1, unique=True))
    hosts: dict[str, tuple[Iface, ...]] = {}
    for i in range(n):
        real = Iface(draw(NAMES), True, (f"{base.network_address + hosts_addr[i]}/{prefix}",))
        noise = [LO]
        if draw(st.booleans()):
            noise.append(docker())  # the same address on many hosts
        if draw(st.booleans()):
            noise.append(Iface("virbr0", True, ("192.168.122.1/24",)))
        if draw(st.booleans()):  # a network only this host is on
            noise.append(Iface("wlan9", True, (f"192.168.{100 + i}.7/24",)))
        if draw(st.booleans()):  # a full mesh, but down on this host... only here
            noise.append(Iface("eth7", False, (f"172.31.0.{i + 1}/24",)))
        if draw(st.booleans()):
            noise.append(Iface("eth8", True, (f"169.254.{i}.1/16",)))
        hosts[f"h{i + 1}"] = tuple(draw(st.permutations([*noise, real])))
    local = None
    if draw(st.booleans()):
        local = Iface("br9", True, (f"{base.network_address + hosts_addr[n]}/{prefix}",))
    return str(base), hosts, local


@given(clusters())
def test_the_real_network_is_found_through_any_noise(cluster: tuple[str, dict[str, tuple[Iface, ...]], Iface | None]) -> None:
    subnet, hosts, local = cluster
    choice = choose_network(hosts, (LO, local) if local else None)
    assert choice.ok, choice.problem
    assert choice.cidrs == (subnet,)
    net = ipaddress.ip_network(subnet)
    for name, ifaces in hosts.items():
        mine = dict(choice.names)[name]
        assert len(mine) == 1
        assert any(ipaddress.ip_interface(a).ip in net for i in ifaces if i.name == mine[0] for a in i.addresses)
    reverse = choose_network(dict(reversed(list(hosts.items()))), (LO, local) if local else None)
    assert reverse.cidrs == choice.cidrs


ADDRESS = st.builds(lambda a, b, p: f"10.0.{a}.{b}/{p}", st.integers(0, 3), st.integers(1, 4), st.sampled_from([16, 24, 30]))
ANY_HOST = st.lists(st.builds(Iface, NAMES | st.just("docker0"), st.booleans(),
                              st.lists(ADDRESS, max_size=2).map(tuple)), max_size=3).map(tuple)


@given(st.dictionaries(st.sampled_from(["h1", "h2", "h3", "h4"]), ANY_HOST, min_size=2))
def test_a_chosen_network_reaches_every_host_on_its_own_address(hosts: dict[str, tuple[Iface, ...]]) -> None:
    choice = choose_network(hosts)
    if not choice.cidrs:
        return
    net = ipaddress.ip_network(choice.cidrs[0])
    mine = {h: {ipaddress.ip_interface(a).ip for i in ifs if i.up for a in i.addresses}
            for h, ifs in hosts.items()}
    for h in hosts:
        own = {ip for ip in mine[h] if ip in net}
        others = set().union(*(mine[o] for o in hosts if o != h and mine[o] != mine[h]))
        assert own - others, (h, choice)
