"""The probe's GPU facts from a fake `nvidia-smi` on PATH that prints recorded output (this
machine has no GPU): several models and drivers, a failing one, a hung one (the probe's own
deadline), none at all; and env-check's GPU rows from them."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.envcheck import HOST, PY, rows
from helpers.gpus import (
    A100_HEADER,
    A100_QUERY,
    H100_HEADER,
    H100_QUERY,
    MISMATCH,
    NO_DRIVER,
    V100_HEADER,
    V100_QUERY,
    fake_smi,
)
from helpers.procs import sleeping, survivors
from helpers.suite import dtlaunch_argv

from dtlaunch.check.facts import GpuFacts, HostFacts, parse_gpu_facts
from dtlaunch.check.report import FAIL, PASS
from dtlaunch.doctor.envcheck import evaluate_env, gather_env
from dtlaunch.probe.command import ProbeArgs, probe_local


def probe_with(folder: Path | None, monkeypatch: pytest.MonkeyPatch, **kw: float) -> HostFacts:
    path = [p for p in os.environ["PATH"].split(":")
            if not os.path.exists(os.path.join(p, "nvidia-smi"))]
    monkeypatch.setenv("PATH", ":".join(([str(folder)] if folder else []) + path))
    return probe_local(ProbeArgs(python=sys.executable, imports=False, **kw), timeout=60)


@pytest.mark.parametrize(("query", "header", "count", "driver", "cuda"), [
    (H100_QUERY, H100_HEADER, 8, "550.54.15", "12.4"),
    (A100_QUERY, A100_HEADER, 4, "535.129.03", "12.2"),
    (V100_QUERY, V100_HEADER, 1, "470.182.03", "11.4"),
])
def test_the_probe_reads_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, query: str,
                                    header: str, count: int, driver: str, cuda: str) -> None:
    facts = probe_with(fake_smi(tmp_path / "bin", query, header), monkeypatch)
    assert facts.gpus == parse_gpu_facts(query, header)
    assert (facts.gpus.count, facts.gpus.driver, facts.gpus.cuda) == (count, driver, cuda)
    assert facts.hostname  # the rest of the probe is untouched


def test_no_nvidia_smi_is_no_gpu_and_no_error(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe_with(None, monkeypatch).gpus == GpuFacts()


@pytest.mark.parametrize(("output", "status", "expected"), [
    (NO_DRIVER, 9, GpuFacts(smi=True, note="nvidia-smi found but no NVIDIA driver loaded")),
    (MISMATCH, 18, GpuFacts(smi=True, error="Failed to initialize NVML: Driver/library version "
                                           "mismatch")),
    ("No devices were found\n", 6, GpuFacts(smi=True)),
])
def test_a_failing_nvidia_smi_is_a_fact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        output: str, status: int, expected: GpuFacts) -> None:
    facts = probe_with(fake_smi(tmp_path / "bin", output, output, status), monkeypatch)
    assert facts.gpus == expected


def test_a_hung_nvidia_smi_is_a_timed_out_fact_not_a_hang(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexec sleep 3017\n")  # a driver that never answers
    smi.chmod(0o755)
    # probe_local's own 60 s deadline would raise: the probe returns by the GPU deadline.
    facts = probe_with(folder, monkeypatch, gpu_timeout=0.5)
    assert facts.gpus == GpuFacts(smi=True, error="nvidia-smi did not answer within 0.5 s")
    assert facts.python.found and facts.hostname  # the other facts still came
    # Nothing left behind: the probe's session got SIGKILL, which a loaded machine may take a
    # moment to deliver, so the check allows it a bounded moment, never a hang.
    assert not survivors(lambda: sleeping("3017"))


def test_env_check_lists_gpus_driver_cuda_and_nccl() -> None:
    facts, _ = gather_env()
    gpus = parse_gpu_facts(A100_QUERY, A100_HEADER)
    facts["gpus"].update(devices=[f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in gpus.gpus],
                         count=4, driver="535.129.03", cuda="12.2", nccl="2.18.1")
    host = dataclasses.replace(HOST, gpus=gpus,
                               python=dataclasses.replace(PY, torch_cuda="12.1",
                                                          torch_nccl="2.18.1"))
    gpu_rows = rows(evaluate_env(facts, host), "gpus")
    assert gpu_rows[0][0:2] == ("devices", PASS) and gpu_rows[0][2].count("NVIDIA A100") == 4
    assert gpu_rows[1:] == [("driver", PASS, "535.129.03"), ("cuda", PASS, "12.2"),
                            ("nccl", PASS, "2.18.1")]
    # PyTorch built for a newer CUDA than the driver supports; a hung nvidia-smi.
    newer = dataclasses.replace(host, python=dataclasses.replace(host.python, torch_cuda="12.4"))
    assert rows(evaluate_env(facts, newer), "gpus")[-1] == (
        "cuda", FAIL, "PyTorch is built for CUDA 12.4 but the driver supports CUDA 12.2 at most")
    hung = dataclasses.replace(HOST, gpus=GpuFacts(smi=True, error="nvidia-smi did not answer "
                                                                   "within 10 s"))
    facts["gpus"].update(devices=[], count=0)
    assert rows(evaluate_env(facts, hung), "gpus") == [
        ("devices", PASS, "none found"),
        ("nvidia-smi", FAIL, "nvidia-smi failed: nvidia-smi did not answer within 10 s")]


def test_env_check_on_a_cpu_host_says_none_found_and_passes() -> None:
    facts, _ = gather_env()
    facts["gpus"].update(devices=[], count=0)
    assert rows(evaluate_env(facts, HOST), "gpus") == [("devices", PASS, "none found")]


def test_env_check_json_from_a_fake_nvidia_smi(tmp_path: Path) -> None:
    folder = fake_smi(tmp_path / "bin", A100_QUERY, A100_HEADER)
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    result = subprocess.run(dtlaunch_argv("env-check", "--json"), capture_output=True, text=True,
                            env=env, timeout=120)
    assert "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert (doc["gpus"]["count"], doc["gpus"]["driver"], doc["gpus"]["cuda"]) == (
        4, "535.129.03", "12.2")
    assert doc["gpus"]["devices"][0] == ("GPU 0: NVIDIA A100-SXM4-40GB "
                                         "(UUID: GPU-1a2b3c4d-0000-1111-2222-333344445555)")
    assert {"section": "gpus", "name": "driver", "value": "535.129.03", "status": "pass",
            "hint": ""} in doc["items"]
