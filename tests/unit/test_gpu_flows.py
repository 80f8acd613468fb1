"""GPU-aware slots and the doctor's GPU rows, in-process against the fake prober of
test_flows.py: hosts report recorded nvidia-smi output, the run's mpirun line is recorded."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.flows import FakeWorld, RecordingJob, cache, facts, needs_mpirun, run_request
from helpers.gpus import A100_HEADER, A100_QUERY, H100_HEADER, H100_QUERY, V100_HEADER, V100_QUERY

from dtlaunch.check.facts import GpuFacts, HostFacts, parse_gpu_facts
from dtlaunch.check.host_checks import Expectations
from dtlaunch.check.report import FAIL, PASS, WARN
from dtlaunch.console.render import report_to_dict
from dtlaunch.core.errors import UsageError
from dtlaunch.doctor.doctor import DoctorRequest, run_doctor
from dtlaunch.job.hosts import parse_hosts
from dtlaunch.job.iface import parse_iface
from dtlaunch.reach.ssh_options import SshOptions
from dtlaunch.run import session

__all__ = ["cache"]  # the fixture, used by name

TWO_A100 = parse_gpu_facts("".join(A100_QUERY.splitlines(keepends=True)[:2]), A100_HEADER)


def with_gpus(name: str, gpus: GpuFacts = TWO_A100, nccl: str | None = "2.18.1") -> HostFacts:
    host = facts(name)
    return replace(host, gpus=gpus,
                   python=replace(host.python, torch_cuda="12.1", horovod_nccl=nccl))


def gpu_world(**hosts: HostFacts) -> FakeWorld:
    return FakeWorld(**(hosts or {"h1": with_gpus("h1"), "h2": with_gpus("h2")}))


def launch(world: FakeWorld, events: list[session.Event], **kw: Any) -> tuple[Any, RecordingJob]:
    job = RecordingJob()
    check, use_cache = kw.pop("check", True), kw.pop("use_cache", True)
    outcome = session.launch(session.LaunchRequest(run_request(**kw), check=check,
                                                   use_cache=use_cache),
                             events.append, executor=job, reach=world.reach())
    return outcome, job


def hosts_arg(argv: tuple[str, ...]) -> tuple[str, str]:
    return argv[argv.index("-H") + 1], argv[argv.index("-np") + 1]


def notes(events: list[session.Event]) -> list[str]:
    return [e.text for e in events if e.level is session.EventLevel.NOTE]


@needs_mpirun
def test_hosts_without_slots_get_one_per_gpu_also_from_the_cache(cache: Path) -> None:
    world, events = gpu_world(), []
    outcome, job = launch(world, events, hosts=parse_hosts("h1,h2"))
    assert outcome.exit_code == 0 and hosts_arg(job.argv[0]) == ("h1:2,h2:2", "4")
    assert outcome.plan.rank_hosts == ("h1", "h1", "h2", "h2")
    assert "slots: one per NVIDIA GPU on h1:2, h2:2" in notes(events)
    # A cached pre-flight remembers the GPUs: same slots, no probe.
    events.clear()
    _, job = launch(world, events, hosts=parse_hosts("h1,h2"))
    assert hosts_arg(job.argv[0]) == ("h1:2,h2:2", "4") and sorted(world.probed) == ["h1", "h2"]
    assert "slots: one per NVIDIA GPU on h1:2, h2:2" in notes(events)


@needs_mpirun
def test_written_slots_win_and_cpu_hosts_keep_one(cache: Path) -> None:
    world, events = gpu_world(h1=with_gpus("h1"), h2=facts("h2")), []
    _, job = launch(world, events, hosts=parse_hosts("h1:1,h2:3"))
    assert hosts_arg(job.argv[0]) == ("h1:1,h2:3", "4")
    assert not any(t.startswith("slots:") for t in notes(events))
    _, job = launch(world, events, hosts=parse_hosts("h1,h2"), use_cache=False)
    assert hosts_arg(job.argv[-1]) == ("h1:2,h2:1", "3")
    assert notes(events)[-1] == ("slots: one per NVIDIA GPU on h1:2; "
                                 "1 on h2 (none given, no NVIDIA GPU)")


@needs_mpirun
def test_np_is_held_against_the_gpu_slots(cache: Path) -> None:
    world, events = gpu_world(), []
    _, job = launch(world, events, hosts=parse_hosts("h1,h2"), num_proc=3)
    assert hosts_arg(job.argv[0]) == ("h1:2,h2:2", "3")
    with pytest.raises(UsageError, match="-np: 5 processes but the hosts have only 4 slots"):
        launch(world, events, hosts=parse_hosts("h1,h2"), num_proc=5)


@needs_mpirun
def test_cpu_only_hosts_launch_as_before_and_see_nothing_about_gpus(cache: Path) -> None:
    world, events = FakeWorld(h1=facts("h1"), h2=facts("h2")), []
    _, job = launch(world, events, hosts=parse_hosts("h1,h2"))
    assert hosts_arg(job.argv[0]) == ("h1:1,h2:1", "2")
    assert not any("GPU" in t for t in notes(events))
    detail = [e.text for e in events if e.level is session.EventLevel.DETAIL]
    assert "slots: 1 on h1, h2 (none given, no NVIDIA GPU)" in detail


@needs_mpirun
def test_no_check_keeps_one_slot_and_says_why(cache: Path) -> None:
    world, events = gpu_world(), []
    _, job = launch(world, events, hosts=parse_hosts("h1,h2"), check=False)
    assert hosts_arg(job.argv[0]) == ("h1:1,h2:1", "2") and world.probed == []
    assert any(e.text.startswith("slots: 1 on h1, h2 (none given; planned without the pre-flight") for e in events)


@needs_mpirun
def test_this_machine_one_slot_per_visible_gpu(cache: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    world, events = FakeWorld(), []
    world.here = lambda *a: with_gpus("launcher", parse_gpu_facts(A100_QUERY))  # type: ignore[method-assign]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _, job = launch(world, events, hosts=())
    assert hosts_arg(job.argv[0]) == ("localhost:4", "4")
    # The launcher's CUDA_VISIBLE_DEVICES reaches its own ranks: only those GPUs count.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    _, job = launch(world, events, hosts=(), use_cache=False)
    assert hosts_arg(job.argv[0]) == ("localhost:2", "2")


def doctor(world: FakeWorld, *hosts: str) -> Any:
    # An --iface the hosts have: doctor chooses no network, so the job's rows are the GPUs' only.
    request = DoctorRequest(hosts=hosts, expect=Expectations(python=sys.executable,
                                                             iface=parse_iface("eth0")),
                            ssh=SshOptions(connect_timeout=1), command_timeout=30)
    return run_doctor(request, reach=world.reach())[0]


def test_doctor_lists_each_hosts_gpus_and_passes_a_uniform_cluster() -> None:
    report = doctor(gpu_world(), "h1", "h2")
    assert report.ok and [(c.name, c.status) for c in report.job] == [("gpus", PASS)]
    assert report.job[0].detail == "2 x NVIDIA A100-SXM4-40GB per host, driver 535.129.03, CUDA 12.2"
    h1 = dict(report.hosts[1].versions)
    assert (h1["gpus"], h1["driver"], h1["cuda"], h1["nccl"]) == (
        "2 x NVIDIA A100-SXM4-40GB", "535.129.03", "12.2", "2.18.1")
    doc = report_to_dict(report)
    assert doc["hosts"][0]["gpus"] is None  # the launcher: no nvidia-smi
    assert doc["hosts"][2]["gpus"]["count"] == 2 and doc["hosts"][2]["gpus"]["nccl"] == "2.18.1"
    assert doc["hosts"][2]["gpus"]["devices"][1]["uuid"].startswith("GPU-1a2b3c4d")
    assert doc["job"][0]["name"] == "gpus"


def test_doctor_flags_every_mismatch_with_a_fix() -> None:
    world = gpu_world(h1=with_gpus("h1", parse_gpu_facts(H100_QUERY, H100_HEADER)),
                      h2=with_gpus("h2", TWO_A100),
                      h3=with_gpus("h3", parse_gpu_facts(V100_QUERY, V100_HEADER), nccl="2.19.3"))
    report = doctor(world, "h1", "h2", "h3")
    job = [(c.status, c.detail) for c in report.job]
    assert job == [
        (WARN, "GPUs per host differ: 1 on h3, 2 on h2, 8 on h1"),
        (WARN, "NVIDIA drivers differ: 470.182.03 on h3, 535.129.03 on h2, 550.54.15 on h1"),
        (FAIL, "h3: PyTorch is built for CUDA 12.1 but the driver supports CUDA 11.4 at most"),
        (FAIL, "NCCL versions differ: 2.18.1 on h1, h2, 2.19.3 on h3"),
    ]
    assert all(c.hint for c in report.job) and not report.ok
    assert ("all hosts", "gpus") in [(h, c.name) for h, c in report.failures()]


@needs_mpirun
def test_a_hung_nvidia_smi_stops_the_run_before_launch(cache: Path) -> None:
    hung = GpuFacts(smi=True, error="nvidia-smi did not answer within 10 s")
    world, events = gpu_world(h1=with_gpus("h1"), h2=replace(facts("h2"), gpus=hung)), []
    outcome, job = launch(world, events, hosts=parse_hosts("h1,h2"))
    assert job.argv == [] and outcome.exit_code == 1
    assert outcome.error.startswith("pre-flight checks failed: all hosts (gpus); not launching")
    (check,) = [c for _, c in outcome.preflight.failures()]
    assert check.detail == "h2: nvidia-smi failed: nvidia-smi did not answer within 10 s"


def test_cpu_only_doctor_has_no_gpu_rows() -> None:
    report = doctor(FakeWorld(h1=facts("h1"), h2=facts("h2")), "h1", "h2")
    assert report.ok and report.job == ()
    assert all("gpus" not in dict(h.versions) for h in report.hosts)
    # nvidia-smi without a driver (a CPU host from a CUDA image) is no failure either.
    no_driver = GpuFacts(smi=True, note="nvidia-smi found but no NVIDIA driver loaded")
    report = doctor(FakeWorld(h1=replace(facts("h1"), gpus=no_driver), h2=facts("h2")), "h1", "h2")
    assert report.ok and [c.status for c in report.job] == ["skip"]


def test_dry_run_says_where_the_slots_come_from(tmp_path: Path) -> None:
    import subprocess

    from helpers.suite import dtlaunch_argv

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    result = subprocess.run(dtlaunch_argv("run", "--dry-run", "-H", "h1,h2:2", str(script)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "-H h1:1,h2:2" in result.stdout
    assert ("dtlaunch: slots: 1 on h1 (none given; a dry run does not probe the hosts; a checked "
            "run gives hosts with NVIDIA GPUs one slot per GPU)") in result.stderr
    written = subprocess.run(dtlaunch_argv("run", "--dry-run", "-H", "h1:1,h2:2", str(script)),
                             capture_output=True, text=True, timeout=60)
    assert "slots" not in written.stderr
