"""Scheduler allocations from environments and files: Slurm, PBS/Torque, LSF. Pure code."""

from __future__ import annotations

from pathlib import Path

import hostlist
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.cluster.allocation import (
    Allocation,
    check_hosts_in_allocation,
    detect,
    parse_lsb_mcpu_hosts,
    parse_nodefile,
    parse_slurm_nodelist,
    parse_slurm_tasks_per_node,
    read_allocation_file,
)
from dtlaunch.core.errors import UsageError
from dtlaunch.job.env import SLURM_LAUNCH_NAMES, looks_secret, slurm_launch_env
from dtlaunch.job.hosts import Host


def files(**texts: str):  # a reader over in-memory files, for detect()
    def read(path: str, var: str) -> str:
        return texts[path]
    return read


# --- Slurm ------------------------------------------------------------------------------------

def test_slurm_nodelist_and_tasks_per_node() -> None:
    env = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "node[01-04,07],gpu-a[1-2]",
           "SLURM_TASKS_PER_NODE": "2(x3),1(x2),4,3", "SLURM_NTASKS": "15"}
    alloc = detect(env)
    assert alloc == Allocation(
        "Slurm", "1234",
        (Host("node01", 2), Host("node02", 2), Host("node03", 2), Host("node04", 1),
         Host("node07", 1), Host("gpu-a1", 4), Host("gpu-a2", 3)),
        total_tasks=15)
    assert alloc.describe() == ("hosts from Slurm job 1234: node01:2,node02:2,node03:2,node04:1,"
                                "node07:1,gpu-a1:4,gpu-a2:3")


def test_slurm_salloc_environment_as_measured_on_the_bed() -> None:
    # What `salloc -N2` gave on the test bed's Slurm 22.05 (no -n: whole nodes, 2 CPUs each).
    env = {"SLURM_JOB_ID": "3", "SLURM_JOBID": "3", "SLURM_JOB_NODELIST": "h[1-2]",
           "SLURM_NODELIST": "h[1-2]", "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
           "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2"}
    alloc = detect(env)
    assert alloc is not None
    assert alloc.hosts == (Host("h1", 2), Host("h2", 2))
    assert alloc.total_tasks == 4
    assert alloc.describe() == "hosts from Slurm job 3: h1:2,h2:2"


def test_slurm_old_variable_names_and_fallbacks() -> None:
    alloc = detect({"SLURM_JOBID": "7", "SLURM_NODELIST": "a,b"})
    assert alloc is not None and alloc.hosts == (Host("a", 1), Host("b", 1))
    assert alloc.total_tasks == 2
    # No task counts: CPUs per node divided by CPUs per task, as Open MPI counts slots.
    alloc = detect({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "a,b",
                    "SLURM_JOB_CPUS_PER_NODE": "8,3", "SLURM_CPUS_PER_TASK": "4"})
    assert alloc is not None and alloc.hosts == (Host("a", 2), Host("b", 1))
    assert alloc.cpus_per_task == 4


def test_slurm_ntasks_below_the_slots_limits_total() -> None:
    alloc = detect({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]",
                    "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": "3"})
    assert alloc is not None and alloc.total_tasks == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node[01-"}, "SLURM_JOB_NODELIST: malformed node list 'node[01-'"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[3-1]"}, "SLURM_JOB_NODELIST: malformed"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[a-b]"}, "SLURM_JOB_NODELIST: malformed"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]]"}, "SLURM_JOB_NODELIST: malformed"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST: empty node list"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": ","}, "SLURM_JOB_NODELIST: empty node list"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a b"}, "SLURM_JOB_NODELIST: invalid host name 'a b'"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a:2"}, "SLURM_JOB_NODELIST: invalid host name 'a:2'"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1,n[1-2]"}, "SLURM_JOB_NODELIST: node 'n1' is listed more than once"),
        ({"SLURM_JOB_ID": "1", "SLURM_NODELIST": "n["}, "SLURM_NODELIST: malformed"),
        ({"SLURM_JOB_ID": "1"}, "SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not"),
        ({"SLURM_JOB_ID": "abc", "SLURM_JOB_NODELIST": "a"}, "SLURM_JOB_ID: expected a job number, got 'abc'"),
        ({"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": "a"}, "SLURM_JOB_ID: expected a job number"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "2(x3"}, "SLURM_TASKS_PER_NODE: malformed task counts '2(x3'"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "x"}, "SLURM_TASKS_PER_NODE: malformed"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": ""}, "SLURM_TASKS_PER_NODE: malformed"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "-1"}, "SLURM_TASKS_PER_NODE: malformed"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "2,,1"}, "SLURM_TASKS_PER_NODE: malformed"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "0"}, "SLURM_TASKS_PER_NODE: every node needs at least 1 task"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "2(x0)"}, "SLURM_TASKS_PER_NODE: every node needs at least 1 task"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "2(x3)"}, "SLURM_TASKS_PER_NODE: gives 3 task counts for the 2 nodes"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a,b", "SLURM_JOB_CPUS_PER_NODE": "4"}, "SLURM_JOB_CPUS_PER_NODE: gives 1 task counts for the 2 nodes"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_NTASKS": "many"}, "SLURM_NTASKS: expected a whole number"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_NTASKS": "2"}, "SLURM_NTASKS: 2 tasks but the nodes have 1 task slots"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a", "SLURM_CPUS_PER_TASK": "0"}, "SLURM_CPUS_PER_TASK: expected a whole number of at least 1, got '0'"),
    ],
)
def test_slurm_bad_input_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        detect(env)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


_names = st.from_regex(r"[a-z][a-z-]{0,5}[a-z]?", fullmatch=True)
_nodes = st.tuples(_names, st.integers(0, 2000), st.sampled_from(["", "0", "00"]))


@given(st.lists(_nodes, min_size=1, max_size=40, unique=True))
def test_slurm_nodelist_round_trips_through_the_library(parts: list[tuple[str, int, str]]) -> None:
    names = sorted({f"{prefix}{pad}{num}" for prefix, num, pad in parts})
    compressed = hostlist.collect_hostlist(names)
    parsed = parse_slurm_nodelist(compressed)
    assert sorted(parsed) == names
    assert len(parsed) == len(names)


def _compress_counts(counts: list[int]) -> str:
    """Slurm's own form: runs of equal counts as N(xK)."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(out)


@given(st.lists(st.integers(1, 128), min_size=1, max_size=60))
def test_tasks_per_node_round_trips(counts: list[int]) -> None:
    assert parse_slurm_tasks_per_node(_compress_counts(counts)) == tuple(counts)


@given(st.lists(st.integers(1, 16), min_size=1, max_size=30))
def test_slurm_allocation_matches_nodes_and_counts(counts: list[int]) -> None:
    names = [f"n{i:03d}" for i in range(len(counts))]
    alloc = detect({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": hostlist.collect_hostlist(names),
                    "SLURM_TASKS_PER_NODE": _compress_counts(counts)})
    assert alloc is not None
    assert alloc.hosts == tuple(Host(n, c) for n, c in zip(names, counts))
    assert alloc.total_tasks == sum(counts)


# --- PBS / LSF --------------------------------------------------------------------------------

def test_pbs_nodefile_one_line_per_slot() -> None:
    env = {"PBS_JOBID": "4711.pbs-server", "PBS_NODEFILE": "/var/spool/pbs/aux/4711.pbs-server"}
    text = "cn01.cluster\ncn01.cluster\ncn02.cluster\n\ncn01.cluster\ncn03.cluster\n"
    alloc = detect(env, files(**{env["PBS_NODEFILE"]: text}))
    assert alloc == Allocation("PBS", "4711.pbs-server",
                               (Host("cn01.cluster", 3), Host("cn02.cluster", 1), Host("cn03.cluster", 1)),
                               total_tasks=5)
    assert alloc.describe() == "hosts from PBS job 4711.pbs-server: cn01.cluster:3,cn02.cluster:1,cn03.cluster:1"


def test_lsf_hostfile_and_mcpu_hosts() -> None:
    env = {"LSB_JOBID": "88", "LSB_DJOB_HOSTFILE": "/tmp/.lsbatch/88.hostfile",
           "LSB_MCPU_HOSTS": "ignored 1"}
    alloc = detect(env, files(**{"/tmp/.lsbatch/88.hostfile": "hostA\nhostA\nhostB\nhostB\n"}))
    assert alloc is not None and alloc.hosts == (Host("hostA", 2), Host("hostB", 2))
    alloc = detect({"LSB_JOBID": "88", "LSB_MCPU_HOSTS": "hostA 2 hostB 4"})
    assert alloc is not None and alloc.hosts == (Host("hostA", 2), Host("hostB", 4))
    assert alloc.launch_node is None and alloc.total_tasks == 6


def test_lsf_launch_node_with_one_slot_is_left_out() -> None:
    # IBM's launch-node set-up: the batch node holds 1 slot, the compute nodes many.
    alloc = detect({"LSB_JOBID": "3", "LSB_MCPU_HOSTS": "batch3 1 a01n01 42 a01n02 42"})
    assert alloc is not None
    assert alloc.hosts == (Host("a01n01", 42), Host("a01n02", 42))
    assert alloc.launch_node == "batch3"
    assert alloc.describe() == "hosts from LSF job 3: a01n01:42,a01n02:42 (launch node batch3 left out)"
    # A one-slot first host among one-slot hosts is an ordinary compute slot.
    alloc = detect({"LSB_JOBID": "3", "LSB_MCPU_HOSTS": "a 1 b 1"})
    assert alloc is not None and alloc.names == ("a", "b")


@pytest.mark.parametrize(
    ("env", "texts", "message"),
    [
        ({"PBS_NODEFILE": "/nf"}, {"/nf": ""}, "/nf: no hosts in the file"),
        ({"PBS_NODEFILE": "/nf"}, {"/nf": "a\nb c\n"}, "/nf:2: expected one host name per line, got 'b c'"),
        ({"PBS_NODEFILE": "/nf"}, {"/nf": "a\nb!x\n"}, "/nf: invalid host name 'b!x'"),
        ({"PBS_NODEFILE": "/nf"}, {"/nf": "a:4\n"}, "/nf: invalid host name 'a:4'"),
        ({"PBS_JOBID": "1"}, {}, "PBS_JOBID is set but PBS_NODEFILE is not"),
        ({"LSB_JOBID": "1"}, {}, "LSB_JOBID is set but neither LSB_DJOB_HOSTFILE nor LSB_MCPU_HOSTS"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "a 2 b"}, {}, "LSB_MCPU_HOSTS: expected pairs of host and slots"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "a two"}, {}, "LSB_MCPU_HOSTS: expected slots of at least 1, got 'two'"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "a 0"}, {}, "LSB_MCPU_HOSTS: expected slots of at least 1, got '0'"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "a 1 a 2"}, {}, "LSB_MCPU_HOSTS: a host is listed more than once"),
        ({"LSB_JOBID": "1", "LSB_DJOB_HOSTFILE": "/hf"}, {"/hf": "\n\n"}, "/hf: no hosts in the file"),
    ],
)
def test_pbs_lsf_bad_input_names_the_variable_or_file(env: dict[str, str], texts: dict[str, str],
                                                      message: str) -> None:
    with pytest.raises(UsageError) as err:
        detect(env, files(**texts))
    assert str(err.value).startswith(message), str(err.value)


def test_reader_names_variable_and_file(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    with pytest.raises(UsageError, match=rf"^PBS_NODEFILE: cannot read {missing}: No such file"):
        detect({"PBS_NODEFILE": str(missing)})
    binary = tmp_path / "bin"
    binary.write_bytes(b"a\x00b")
    with pytest.raises(UsageError, match=r"^LSB_DJOB_HOSTFILE: .* is a binary file"):
        read_allocation_file(str(binary), "LSB_DJOB_HOSTFILE")
    latin = tmp_path / "latin"
    latin.write_bytes(b"caf\xe9\n")
    with pytest.raises(UsageError, match=r"^PBS_NODEFILE: .*: not valid UTF-8 text"):
        read_allocation_file(str(latin), "PBS_NODEFILE")
    good = tmp_path / "nodes"
    good.write_text("n1\nn1\nn2\n")
    alloc = detect({"PBS_NODEFILE": str(good)})
    assert alloc is not None and alloc.hosts == (Host("n1", 2), Host("n2", 1))


@given(st.lists(st.sampled_from(["a", "b.x", "c-1", "10.0.0.7"]), min_size=1, max_size=50))
def test_nodefile_counts_slots_in_first_seen_order(lines: list[str]) -> None:
    hosts = parse_nodefile("\n".join(lines) + "\n", "nf")
    assert [h.name for h in hosts] == list(dict.fromkeys(lines))
    assert all(h.slots == lines.count(h.name) for h in hosts)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 99)),
                min_size=1, max_size=4, unique_by=lambda t: t[0]))
def test_lsb_mcpu_hosts_round_trip(pairs: list[tuple[str, int]]) -> None:
    text = " ".join(f"{h} {n}" for h, n in pairs)
    assert parse_lsb_mcpu_hosts(text) == tuple(Host(h, n) for h, n in pairs)


def test_no_scheduler_means_no_allocation() -> None:
    assert detect({"PATH": "/usr/bin", "HOME": "/root"}) is None


def test_slurm_wins_over_pbs_and_lsf() -> None:
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "s1", "PBS_NODEFILE": "/x",
           "LSB_JOBID": "2", "LSB_MCPU_HOSTS": "l1 1"}
    alloc = detect(env, files())
    assert alloc is not None and alloc.scheduler == "Slurm"


# --- -H inside an allocation, and the launch environment ---------------------------------------

ALLOC = Allocation("Slurm", "1234", (Host("h1", 2), Host("h2.cluster", 2)), 4)


def test_hosts_inside_the_allocation_pass() -> None:
    check_hosts_in_allocation((Host("h1", 1), Host("h2.cluster", 2)), ALLOC)
    check_hosts_in_allocation((Host("h1.cluster", 1), Host("h2", 1)), ALLOC)  # short = full


def test_host_outside_the_allocation_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as err:
        check_hosts_in_allocation((Host("h1", 1), Host("h9", 1), Host("login", 1)), ALLOC)
    assert str(err.value) == ("--hosts: h9, login not in Slurm job 1234's allocation (h1, h2.cluster); "
                              "name allocated nodes or leave out -H")


def test_slurm_launch_env_keeps_exactly_what_open_mpi_and_srun_need() -> None:
    environ = {
        "SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_NNODES": "2", "SLURM_SUBMIT_DIR": "/home/u", "SLURM_JOB_NAME": "x",
        "SLURM_CLUSTER_NAME": "c", "SLURM_STEP_ID": "0", "SLURM_CPU_BIND": "quiet,mask_cpu:0x1",
        "SLURM_SECRET_TOKEN": "s3cr3t", "AWS_SECRET_ACCESS_KEY": "k", "PATH": "/usr/bin",
    }
    assert slurm_launch_env(environ) == {
        "SLURM_JOB_ID": "3", "SLURM_JOBID": "3",
        "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_NODELIST": "h[1-2]",
        "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
    }
    assert slurm_launch_env({"SLURM_JOBID": "4", "SLURM_NODELIST": "a", "SLURM_CPUS_PER_TASK": "2"}) == {
        "SLURM_JOB_ID": "4", "SLURM_JOBID": "4", "SLURM_JOB_NODELIST": "a", "SLURM_NODELIST": "a",
        "SLURM_CPUS_PER_TASK": "2"}
    assert slurm_launch_env({"SLURM_CONF": "/x", "PATH": "/bin"}) == {}
    assert not any(looks_secret(name) for name in SLURM_LAUNCH_NAMES)
