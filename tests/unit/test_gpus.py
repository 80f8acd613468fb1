"""GPU facts from recorded nvidia-smi output, slots per GPU, and cross-host mismatches."""

from __future__ import annotations

import pytest
from helpers import gpus as smi
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.check.facts import (
    Gpu,
    GpuFacts,
    describe_gpus,
    nccl_from_code,
    parse_gpu_facts,
    parse_gpu_probe,
    parse_gpu_query,
    parse_smi_header,
)
from dtlaunch.check.gpus import (
    check_gpus,
    choose_slots,
    slots_pending,
    unchecked_slots_text,
    visible_devices,
)
from dtlaunch.check.host_checks import FAIL, PASS, SKIP, WARN
from dtlaunch.core.errors import UsageError
from dtlaunch.job.hosts import Host, parse_hosts
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import RunRequest, plan_run


def test_h100_host() -> None:
    facts = parse_gpu_facts(smi.H100_QUERY, smi.H100_HEADER)
    assert facts.smi and facts.count == 8 and not facts.error
    assert facts.gpus[3] == Gpu(3, "NVIDIA H100 80GB HBM3", "GPU-5e2c6e36-8c3a-3b8f-1f7a-6d2f4e1c9a03",
                                "550.54.15", 81559)
    assert (facts.driver, facts.cuda) == ("550.54.15", "12.4")


def test_headers_of_several_driver_generations() -> None:
    assert parse_smi_header(smi.A100_HEADER) == ("535.129.03", "12.2")
    assert parse_smi_header(smi.V100_HEADER) == ("470.182.03", "11.4")
    assert parse_smi_header("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: N/A |") == ("550.54.15", None)
    assert parse_smi_header("garbage") == (None, None)


def test_failures_and_absence() -> None:
    assert parse_gpu_facts(None) == GpuFacts()
    assert parse_gpu_facts("No devices were found\n") == GpuFacts(smi=True)
    # nvidia-smi installed on a host without a driver (a CPU host built from a CUDA image):
    # no GPUs, not an error.
    assert parse_gpu_facts(smi.NO_DRIVER, smi.NO_DRIVER) == GpuFacts(
        smi=True, note="nvidia-smi found but no NVIDIA driver loaded")
    assert parse_gpu_facts(smi.MISMATCH).error == "Failed to initialize NVML: Driver/library version mismatch"
    # A name with a comma, and memory the driver does not report.
    gpus, error = parse_gpu_query("0, Acme, Accelerator X, GPU-11, 550.1, [N/A]\n")
    assert not error and gpus == (Gpu(0, "Acme, Accelerator X", "GPU-11", "550.1", None),)
    # Without the banner, the driver comes from the query.
    assert parse_gpu_facts(smi.V100_QUERY).driver == "470.182.03"


GPU = st.builds(Gpu, st.integers(0, 15), st.from_regex(r"[A-Za-z][A-Za-z0-9 ,-]{0,20}[A-Za-z0-9]", fullmatch=True),
                st.from_regex(r"GPU-[0-9a-f-]{8,36}", fullmatch=True),
                st.from_regex(r"[0-9]{3}\.[0-9]{1,3}(\.[0-9]{2})?", fullmatch=True),
                st.one_of(st.none(), st.integers(1, 200000)))


@given(st.lists(GPU, max_size=8))
def test_query_round_trip(gpus: list[Gpu]) -> None:
    text = "".join(f"{g.index}, {g.name}, {g.uuid}, {g.driver}, "
                   f"{'[N/A]' if g.memory_mib is None else f'{g.memory_mib} MiB'}\n" for g in gpus)
    assert parse_gpu_query(text) == (tuple(gpus), "")


def test_slots_per_gpu_where_none_were_given() -> None:
    facts = {"h1": parse_gpu_facts(smi.H100_QUERY, smi.H100_HEADER), "h2": parse_gpu_facts(smi.A100_QUERY, smi.A100_HEADER),
             "h3": GpuFacts(smi=False)}
    counts = {h: f.count for h, f in facts.items()}
    hosts = (Host("h1", slots_given=False), Host("h2", 2), Host("h3", slots_given=False))
    assert choose_slots(hosts, counts, None).hosts == (Host("h1", 8), Host("h2", 2), Host("h3"))
    hosts = tuple(Host(h.name, h.slots, slots_given=False) for h in hosts)
    assert choose_slots(hosts, counts, None).hosts == (Host("h1", 8), Host("h2", 4), Host("h3"))


def statuses(results: tuple[object, ...]) -> list[tuple[str, str]]:
    return [(r.status, r.detail) for r in results]  # type: ignore[attr-defined]


def test_a_uniform_cluster_passes() -> None:
    facts = {h: parse_gpu_facts(smi.H100_QUERY, smi.H100_HEADER) for h in ("h1", "h2")}
    result = check_gpus(facts, {"h1": "12.1", "h2": "12.1"}, {"h1": "2.18.1", "h2": "2.18.1"})
    assert statuses(result) == [(PASS, "8 x NVIDIA H100 80GB HBM3 per host, driver 550.54.15, CUDA 12.4")]
    assert check_gpus({"h1": GpuFacts(), "h2": GpuFacts(smi=True)})[0].status == SKIP


def test_mismatches_each_have_a_fix() -> None:
    facts = {"h1": parse_gpu_facts(smi.H100_QUERY, smi.H100_HEADER), "h2": parse_gpu_facts(smi.A100_QUERY, smi.A100_HEADER),
             "h3": parse_gpu_facts(smi.V100_QUERY, smi.V100_HEADER), "h4": GpuFacts(),
             "h5": parse_gpu_facts(smi.MISMATCH, smi.MISMATCH)}
    results = check_gpus(facts, {"h1": "12.1", "h2": "12.1", "h3": "12.1"},
                         {"h1": "2.18.1", "h2": "2.18.1", "h3": "2.19.3"})
    assert statuses(results) == [
        (FAIL, "h5: nvidia-smi failed: Failed to initialize NVML: Driver/library version mismatch"),
        (WARN, "no NVIDIA GPU on h4 while h1, h2, h3 have some"),
        (WARN, "GPUs per host differ: 1 on h3, 4 on h2, 8 on h1"),
        (WARN, "NVIDIA drivers differ: 470.182.03 on h3, 535.129.03 on h2, 550.54.15 on h1"),
        (FAIL, "h3: PyTorch is built for CUDA 12.1 but the driver supports CUDA 11.4 at most"),
        (FAIL, "NCCL versions differ: 2.18.1 on h1, h2, 2.19.3 on h3"),
    ]
    assert all(r.hint for r in results)


@pytest.mark.parametrize(("built", "driver", "ok"), [("12.1", "12.4", True), ("12.4", "12.4", True),
                                                     ("12.10", "12.9", False), ("11.8", "12.2", True)])
def test_cuda_runtime_against_driver(built: str, driver: str, ok: bool) -> None:
    header = f"| NVIDIA-SMI 1.0   Driver Version: 560.1   CUDA Version: {driver}     |"
    results = check_gpus({"h1": parse_gpu_facts(smi.V100_QUERY, header)}, {"h1": built})
    assert (results[0].status == PASS) == ok


# --- what the probe prints, slots for a run -------------------------------------------------

def test_probe_sections() -> None:
    done = "query done\nheader done"
    assert parse_gpu_probe("", "", "") == GpuFacts()  # an older probe: nothing known
    assert parse_gpu_probe("absent", "", "") == GpuFacts()
    assert parse_gpu_probe(done, smi.A100_QUERY, smi.A100_HEADER) == parse_gpu_facts(smi.A100_QUERY, smi.A100_HEADER)
    hung = parse_gpu_probe("query timeout 10000\nheader timeout 10000", "", "")
    assert hung == GpuFacts(smi=True, error="nvidia-smi did not answer within 10 s")
    assert parse_gpu_probe("query timeout 500\nheader done", "", "").error.endswith("within 0.5 s")
    # A hung banner only loses the CUDA version.
    slow = parse_gpu_probe("query done\nheader timeout 10000", smi.V100_QUERY, "")
    assert (slow.count, slow.driver, slow.cuda, slow.error) == (1, "470.182.03", None, "")


@pytest.mark.parametrize(("code", "version"), [(21803, "2.18.3"), (2708, "2.7.8"), (20905, "2.9.5"),
                                               (0, None), (True, None), (None, None), ("2", None)])
def test_nccl_version_codes(code: object, version: str | None) -> None:
    assert nccl_from_code(code) == version


def test_descriptions() -> None:
    assert describe_gpus(parse_gpu_facts(smi.H100_QUERY, smi.H100_HEADER)) == "8 x NVIDIA H100 80GB HBM3"
    mixed = parse_gpu_facts(smi.A100_QUERY + smi.V100_QUERY.replace("0,", "4,", 1))
    assert describe_gpus(mixed) == "4 x NVIDIA A100-SXM4-40GB, 1 x Tesla V100-SXM2-16GB"
    assert describe_gpus(parse_gpu_facts(smi.NO_DRIVER)) == "none (nvidia-smi found but no NVIDIA driver loaded)"
    assert describe_gpus(parse_gpu_facts(smi.MISMATCH)).startswith("nvidia-smi failed: Failed to initialize")


def test_a_hung_nvidia_smi_fails_with_its_own_fix() -> None:
    (result,) = check_gpus({"h1": GpuFacts(smi=True, error="nvidia-smi did not answer within 10 s")})
    assert result.status == FAIL and result.detail == "h1: nvidia-smi failed: nvidia-smi did not answer within 10 s"
    assert "Xid" in result.hint and "h1" in result.hint


def test_cpu_only_hosts_with_nvidia_smi_but_no_driver_are_no_failure() -> None:
    (result,) = check_gpus({"h1": parse_gpu_facts(smi.NO_DRIVER), "h2": GpuFacts()})
    assert result.status == SKIP


def hosts_of(spec: str) -> tuple[Host, ...]:
    return parse_hosts(spec)


def test_slots_come_from_gpus_only_where_none_were_written() -> None:
    counts = {"h1": 2, "h2": 4, "h3": 0}
    chosen = choose_slots(hosts_of("h1,h2:1,h3"), counts, None)
    assert chosen.hosts == (Host("h1", 2), Host("h2", 1), Host("h3", 1)) and chosen.changed
    assert chosen.text == ("slots: one per NVIDIA GPU on h1:2; 1 on h3 (none given, no NVIDIA GPU); "
                           "as given on h2:1")
    unchanged = choose_slots(hosts_of("h1:3,h2:1"), counts, None)
    assert unchanged.hosts == hosts_of("h1:3,h2:1") and not unchanged.changed
    none = choose_slots(hosts_of("h3,h4"), counts, None)
    assert not none.changed and none.text == "slots: 1 on h3, h4 (none given, no NVIDIA GPU)"


def test_this_machine_gets_one_slot_per_gpu_and_at_least_np() -> None:
    assert choose_slots((), {"localhost": 4}, None).hosts == (Host("localhost", 4),)
    # -np 6 on 4 GPUs: still 4 slots, so the plan asks for --oversubscribe (not a silent 6).
    assert choose_slots((), {"localhost": 4}, 6).hosts == (Host("localhost", 4),)
    with pytest.raises(UsageError, match="-np: 6 processes but the hosts have only 4 slots"):
        plan_run(RunRequest(hosts=(Host("localhost", 4),), python="python3", script="t.py",
                            num_proc=6), {}, family=OPEN_MPI)
    assert plan_run(RunRequest(hosts=(Host("localhost", 4),), python="python3", script="t.py",
                               num_proc=6, oversubscribe=True), {}, family=OPEN_MPI).rank_hosts == ("localhost",) * 6
    assert not choose_slots((), {"localhost": 0}, None).changed


def test_slots_pending_and_their_text() -> None:
    assert slots_pending(()) and slots_pending(hosts_of("h1:2,h2")) and not slots_pending(hosts_of("h1:2,h2:1"))
    assert unchecked_slots_text(hosts_of("h1:2,h2:1"), "x") is None
    assert unchecked_slots_text(hosts_of("h1:2,h2,h3"), "a dry run does not probe the hosts") == (
        "slots: 1 on h2, h3 (none given; a dry run does not probe the hosts; a checked run gives "
        "hosts with NVIDIA GPUs one slot per GPU)")


@pytest.mark.parametrize(("value", "visible"), [("0,1", 2), ("GPU-5e2c,GPU-77aa,GPU-1", 3), ("", 0),
                                                ("-1", 0), ("0,-1,2", 1), ("0,1,2,3,4,5,6,7,8", 8)])
def test_cuda_visible_devices_limits_this_machines_gpus(value: str, visible: int) -> None:
    assert visible_devices(value, 8) == visible


# --- which slots were written -----------------------------------------------------------------

def test_written_slots_are_told_apart_from_the_stand_in_one() -> None:
    from dtlaunch.job.hosts import parse_hostfile_text

    assert [h.slots_given for h in parse_hosts("h1,h2:2,h3:1")] == [False, True, True]
    hostfile = parse_hostfile_text("h1\nh2 slots=4\nh3:2\nh4 max_slots=8\n")
    assert [(h.slots, h.slots_given) for h in hostfile] == [(1, False), (4, True), (2, True),
                                                            (1, False)]
    assert Host("h1", 1, slots_given=False) == Host("h1")  # equality ignores where 1 came from


def test_a_slurm_job_without_task_counts_leaves_the_slots_to_the_gpus() -> None:
    from dtlaunch.cluster.allocation import parse_slurm, plan_allocation
    from dtlaunch.plan.plan import RunRequest

    bare = parse_slurm({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert [h.slots_given for h in bare.hosts] == [False, False]
    placed = plan_allocation(RunRequest(hosts=(), python="python3"), bare, "auto")
    assert placed.request.num_proc is None and slots_pending(placed.request.hosts)
    tasks = parse_slurm({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                         "SLURM_TASKS_PER_NODE": "4(x2)"})
    assert all(h.slots_given for h in tasks.hosts)
    assert plan_allocation(RunRequest(hosts=(), python="python3"), tasks, "auto").request.num_proc == 8
