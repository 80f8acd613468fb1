"""Pure checks, judged from hand-made facts."""

from __future__ import annotations

from helpers.facts import IFACES, host_facts, python_facts

from dtlaunch.check.facts import HostFacts, Iface, PythonFacts, parse_ip_output, parse_probe_output
from dtlaunch.check.host_checks import Expectations, check_hostnames, check_iface
from dtlaunch.check.report import FAIL, HOST, LOCAL, PASS, SKIP, WARN, HostOutcome, unreachable
from dtlaunch.check.verdict import evaluate
from dtlaunch.mpi import Interfaces, MpiImpl

PY = python_facts()


def facts(**kw: object) -> HostFacts:
    return host_facts(**kw)  # type: ignore[arg-type]


EXPECT = Expectations(python="/venv/bin/python", script="/job/train.py")


def report(host_facts: HostFacts, expect: Expectations = EXPECT, local: HostFacts | None = None):
    outcomes = [HostOutcome("localhost", LOCAL, local or facts(hostname="launch"),
                            is_rank_host=False),
                HostOutcome("h1", HOST, host_facts)]
    return evaluate(outcomes, expect)


def status(rep, host: str, name: str) -> str:
    host_report = next(h for h in rep.hosts if h.host == host)
    check = host_report.check(name)
    assert check is not None
    return check.status


def test_healthy_host_passes():
    rep = report(facts())
    assert rep.ok
    assert status(rep, "h1", "mpi") == PASS
    assert status(rep, "h1", "pairwise") == SKIP
    assert next(c.name for c in rep.hosts[1].checks) == "reach"


def test_old_open_mpi_fails_with_path_hint():
    rep = report(facts(mpirun="/tmp/fake/mpirun", mpi=MpiImpl("Open MPI", "2.1.1")))
    check = rep.hosts[1].check("mpi")
    assert check is not None and check.status == FAIL
    assert "2.1.1" in check.detail and "older than 3.0" in check.detail
    assert "PATH" in check.hint


def test_mpich_rejected():
    rep = report(facts(mpi=MpiImpl("MPICH", "4.0")))
    check = rep.hosts[1].check("mpi")
    assert check is not None and check.status == FAIL and "MPICH" in check.detail


def test_version_differs_from_this_machine():
    rep = report(facts(mpi=MpiImpl("Open MPI", "4.0.3")))
    check = rep.hosts[1].check("mpi")
    assert check is not None and check.status == FAIL and "4.1.4 on this machine" in check.detail


def test_every_family_is_judged_by_one_procedure_from_its_rule():
    """What differs by family is data (core.mpi_kinds.HostRule): what must match, the daemon,
    and each failure's text; the cases below differ only in that data."""
    from dtlaunch.check.mpi_checks import check_mpi, host_daemon

    def judged(host: MpiImpl | None, local: MpiImpl | None) -> tuple[str, str]:
        check = check_mpi(facts(mpirun="/m/mpirun", mpi=host), local)
        return check.status, check.detail

    ompi, mpich = MpiImpl("Open MPI", "4.1.4"), MpiImpl("MPICH", "5.0.2")
    # Open MPI judges versions only; Hydra names and versions.
    assert judged(MpiImpl("Open MPI", "4.1.4"), ompi) == (PASS, "4.1.4")
    assert judged(MpiImpl("Intel MPI", "5.0.2"), mpich) == (
        FAIL, "Intel MPI 5.0.2 here, MPICH 5.0.2 on this machine")
    # An old MPI on this machine does not hide a host that differs from it.
    assert judged(ompi, MpiImpl("Open MPI", "2.1.1"))[0] == FAIL
    # Too old is said before "not the same", by each family's words.
    assert judged(MpiImpl("MPICH", "2.1"), mpich) == (FAIL, "/m/mpirun is MPICH 2.1; dtlaunch "
                                                      "needs >= 3.0")
    assert judged(MpiImpl("Open MPI", "2.1.1"), ompi) == (
        FAIL, "/m/mpirun is Open MPI 2.1.1, older than 3.0")
    # A host with no MPI dtlaunch knows, named the way each family's rule names it.
    unknown = MpiImpl("unknown", "")
    assert judged(unknown, mpich) == (FAIL, "/m/mpirun is not an MPI; this machine's mpiexec "
                                      "is MPICH 5.0.2")
    assert judged(unknown, ompi) == (FAIL, "/m/mpirun is not Open MPI; dtlaunch needs Open MPI "
                                     ">= 3.0")
    # Alone (env-check; or an MPI on this machine dtlaunch does not know): by the host's own family.
    assert judged(mpich, None) == judged(mpich, MpiImpl("MVAPICH", "")) == (PASS, "MPICH 5.0.2")
    assert judged(None, ompi)[0] == SKIP
    assert (host_daemon(ompi), host_daemon(mpich), host_daemon(None)) == ("orted", "", "orted")


def test_orted_missing_on_remote_but_not_needed_on_this_machine():
    rep = report(facts(orted=None), local=facts(hostname="launch", orted=None))
    assert status(rep, "h1", "mpirun") == FAIL
    assert status(rep, "localhost", "mpirun") == PASS


def test_missing_python_skips_python_checks():
    rep = report(facts(python=PythonFacts(found=False, error="no such file")))
    assert status(rep, "h1", "python") == FAIL
    assert status(rep, "h1", "torch") == SKIP
    assert status(rep, "h1", "horovod") == SKIP


def test_python_minor_mismatch():
    other = PythonFacts(**{**PY.__dict__, "version": "3.10.2"})
    assert status(report(facts(python=other)), "h1", "python") == FAIL


def test_horovod_without_mpi_fails():
    other = PythonFacts(**{**PY.__dict__, "controllers": ("Gloo",)})
    rep = report(facts(python=other))
    check = rep.hosts[1].check("horovod")
    assert check is not None and check.status == FAIL and "without MPI" in check.detail
    assert "HOROVOD_WITH_MPI=1" in check.hint


def test_torch_version_mismatch_and_import_error():
    other = PythonFacts(**{**PY.__dict__, "torch_imported": "2.1.0"})
    assert status(report(facts(python=other)), "h1", "torch") == FAIL
    broken = PythonFacts(**{**PY.__dict__, "torch_error": "ImportError: libc10.so"})
    assert status(report(facts(python=broken)), "h1", "torch") == FAIL


def test_missing_script_and_module():
    assert status(report(facts(script_exists=False)), "h1", "script") == FAIL
    expect = Expectations(python="/venv/bin/python", module="pkg.train")
    missing = PythonFacts(**{**PY.__dict__, "module_found": False})
    assert status(report(facts(python=missing), expect), "h1", "script") == FAIL
    assert status(report(facts(), expect), "h1", "script") == PASS


def test_iface_names_and_cidr():
    assert check_iface(facts(), Interfaces(names=("eth0",))).status == PASS
    missing = check_iface(facts(), Interfaces(names=("ib0",)))
    assert missing.status == FAIL and "missing: ib0" in missing.detail
    assert "eth0 (up, 10.1.2.11/24)" in missing.detail  # the host's interfaces are listed
    assert check_iface(facts(), Interfaces(names=("eth1",))).status == FAIL  # down
    assert check_iface(facts(), Interfaces(cidrs=("10.1.2.0/24",))).status == PASS
    assert check_iface(facts(), Interfaces(cidrs=("10.9.0.0/16",))).status == FAIL
    docker = facts(ifaces=(*IFACES, Iface("docker0", True, ("172.17.0.1/16",))))
    assert check_iface(docker, None).status == WARN
    assert check_iface(facts(ifaces=None), Interfaces(names=("eth0",))).status == WARN


def test_hostnames_unique():
    results = check_hostnames({"a": "node", "b": "node", "c": "other", "d": ""})
    assert results["a"].status == FAIL and "b" in results["a"].detail
    assert results["c"].status == PASS
    assert results["d"].status == SKIP


def test_ssh_failure_marks_rest_skipped():
    outcomes = [HostOutcome("localhost", LOCAL, facts(hostname="launch"), is_rank_host=False),
                HostOutcome("h2", HOST, problem=unreachable("connection refused", "fix"))]
    rep = evaluate(outcomes, EXPECT)
    assert not rep.ok
    h2 = rep.hosts[1]
    assert h2.check("reach") is not None and h2.status == FAIL
    assert [c.status for c in h2.checks[1:]] == [SKIP] * 9
    assert rep.failures() == (("h2", h2.checks[0]),)


def test_pairwise():
    from dtlaunch.check.facts import PeerResult

    expect = Expectations(python="/venv/bin/python", pairwise=True)
    ok = facts(peers=(PeerResult("h2", 0),))
    outcomes = [HostOutcome("localhost", LOCAL, facts(hostname="l"), is_rank_host=False),
                HostOutcome("h1", HOST, ok),
                HostOutcome("h2", HOST, facts(hostname="h2", peers=(
                    PeerResult("h1", 255, "Permission denied"),)))]
    rep = evaluate(outcomes, expect, peers=["h1", "h2"])
    assert status(rep, "h1", "pairwise") == PASS
    bad = rep.hosts[2].check("pairwise")
    assert bad is not None and bad.status == FAIL and "Permission denied" in bad.detail


def test_parse_ip_output():
    link = ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n"
            "2: eth0@if7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n"
            "3: eth1: <BROADCAST,MULTICAST> mtu 1500 state DOWN\n")
    addr = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
            "2: eth0    inet 10.1.2.11/24 brd 10.1.2.255 scope global eth0\\  valid_lft forever\n"
            "2: eth0    inet6 fe80::1/64 scope link \\       valid_lft forever\n")
    ifaces = parse_ip_output(link, addr)
    assert ifaces == (Iface("lo", True, ("127.0.0.1/8",)),
                      Iface("eth0", True, ("10.1.2.11/24", "fe80::1/64")), Iface("eth1", False, ()))
    assert parse_ip_output("", "") is None


def test_parse_probe_output_tolerates_login_noise():
    text = ("Welcome to the cluster!\n@@hostname\nnode1\n@@path\n/usr/bin\n"
            "@@mpirun\n/usr/bin/mpirun\n"
            "@@orted\n\n@@mpirun_version\nmpirun (Open MPI) 2.1.1\n\nReport bugs\n@@script\nno\n"
            "@@python\n{\"missing\": true, \"error\": \"no such file\"}\n@@peers\n@@end\n")
    parsed = parse_probe_output(text)
    assert parsed.hostname == "node1"
    assert parsed.orted is None
    assert parsed.mpi == MpiImpl("Open MPI", "2.1.1")
    assert parsed.script_exists is False
    assert parsed.python.found is False


VENV_MPIRUN = "/shared/venvs/openmpi5/bin/mpirun"
OMPI5 = dict(mpi_launcher=VENV_MPIRUN, mpirun=VENV_MPIRUN, orted="/shared/venvs/openmpi5/bin/prted",
             mpi=MpiImpl("Open MPI", "5.0.11"))


def test_venv_mpi_present_at_the_launchers_path_passes():
    rep = report(facts(**OMPI5), local=facts(hostname="launch", **OMPI5))
    assert status(rep, "h1", "mpirun") == PASS
    assert status(rep, "h1", "mpi") == PASS


def test_venv_mpi_missing_on_a_host_is_named_with_its_path():
    host = facts(mpi_launcher=VENV_MPIRUN, mpirun=None, orted=None, mpi=None)
    rep = report(host, local=facts(hostname="launch", **OMPI5))
    check = next(h for h in rep.hosts if h.host == "h1").check("mpirun")
    assert check is not None and check.status == FAIL
    assert check.detail.startswith(f"{VENV_MPIRUN} not found on this host")
    assert "/shared/venvs/openmpi5/bin on every host" in check.hint


def test_venv_mpi_without_its_daemon_on_a_host_fails():
    rep = report(facts(**{**OMPI5, "orted": None}), local=facts(hostname="launch", **OMPI5))
    assert status(rep, "h1", "mpirun") == FAIL


def test_other_version_at_the_launchers_path_fails():
    other = {**OMPI5, "mpi": MpiImpl("Open MPI", "5.0.3")}
    rep = report(facts(**other), local=facts(hostname="launch", **OMPI5))
    assert status(rep, "h1", "mpi") == FAIL


def test_a_gloo_job_needs_no_mpi_but_horovod_with_gloo():
    from dtlaunch.gloo.family import GLOO

    gloo = Expectations(python="/venv/bin/python", script="/job/train.py", needs=GLOO.needs)
    no_mpi = facts(mpirun=None, orted=None, mpi=None,
                   python=PythonFacts(**{**PY.__dict__, "controllers": ("Gloo",)}))
    rep = report(no_mpi, gloo, local=facts(hostname="launch", mpirun=None, orted=None, mpi=None))
    assert rep.ok
    assert status(rep, "h1", "mpirun") == status(rep, "h1", "mpi") == SKIP
    assert status(rep, "h1", "horovod") == PASS
    without = facts(python=PythonFacts(**{**PY.__dict__, "controllers": ("MPI",)}))
    check = report(without, gloo).hosts[1].check("horovod")
    assert check is not None and check.status == FAIL and "without Gloo" in check.detail


def test_a_torch_job_needs_neither_mpi_nor_horovod_but_the_same_torch():
    from dtlaunch.torchrun.kind import TORCH

    torch = Expectations(python="/venv/bin/python", script="/job/train.py", needs=TORCH.needs)
    bare = facts(mpirun=None, orted=None, mpi=None,
                 python=PythonFacts(**{**PY.__dict__, "horovod_version": None,
                                       "horovod_imported": None, "controllers": ()}))
    rep = report(bare, torch, local=facts(hostname="launch", mpirun=None, orted=None, mpi=None))
    assert rep.ok
    assert status(rep, "h1", "mpirun") == status(rep, "h1", "mpi") == SKIP
    assert status(rep, "h1", "horovod") == SKIP
    assert status(rep, "h1", "torch") == PASS
    other = facts(python=PythonFacts(**{**PY.__dict__, "torch_version": "2.0.1",
                                        "torch_imported": "2.0.1"}))
    check = report(other, torch).hosts[1].check("torch")
    assert check is not None and check.status == FAIL


def test_pairwise_logins_start_after_each_host():
    # Every host logs in to its peers a few at a time; in one shared order, all would log in
    # to the first few hosts at once, past sshd's MaxStartups.
    from dtlaunch.doctor.doctor import rotated_peers

    hosts = ["h1", "h2", "h3", "h4"]
    assert rotated_peers(hosts, "h3") == ("h4", "h1", "h2")
    assert rotated_peers(hosts, "h1") == ("h2", "h3", "h4")
    assert len({rotated_peers(hosts, h)[0] for h in hosts}) == len(hosts)
    assert rotated_peers(hosts, "elsewhere") == tuple(hosts)
