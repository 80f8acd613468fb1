"""GPU-aware slots end to end on the test bed: real sshd, the real probe, the real pre-flight and
plan, real mpirun and ranks.

This machine has no GPU, so one thing is faked: the `nvidia-smi` binary. Each test-bed host's
sshd puts a directory holding a script of that name (printing nvidia-smi output recorded on a
2 x A100 host) first on the PATH of its logins; nothing else differs from a GPU cluster. The
launcher itself has no nvidia-smi and runs no ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.gpus import A100_HEADER, A100_QUERY, fake_smi
from helpers.suite import dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = pytest.mark.testbed

LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TWO_A100 = "".join(A100_QUERY.splitlines(keepends=True)[:2])


def gpu_bed(make_bed: Callable[..., TestBed], folder: Path) -> TestBed:
    path = [f"SetEnv PATH={folder}:{LOGIN_PATH}"]
    return make_bed(2, sshd_extra={"h1": path, "h2": path})


def test_probe_plan_and_mpirun_give_one_rank_per_gpu(make_bed: Callable[..., TestBed],
                                                     tmp_path: Path) -> None:
    folder = fake_smi(tmp_path / "gpu-bin", TWO_A100, A100_HEADER)
    bed = gpu_bed(make_bed, folder)
    launcher_path = ":".join(p for p in os.environ["PATH"].split(":")
                             if not os.path.exists(os.path.join(p, "nvidia-smi")))
    env = {**os.environ, "PATH": launcher_path, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    common = ("-H", "h1,h2", "--ssh-config", str(bed.ssh_config))

    doctor = subprocess.run(dtlaunch_argv("doctor", *common, "--json"), capture_output=True,
                            text=True, env=env, timeout=180)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    report = json.loads(doctor.stdout)
    by_host = {h["host"]: h for h in report["hosts"]}
    for name in ("h1", "h2"):
        gpus = by_host[name]["gpus"]
        assert (gpus["count"], gpus["driver"], gpus["cuda"]) == (2, "535.129.03", "12.2")
        assert by_host[name]["versions"]["gpus"] == "2 x NVIDIA A100-SXM4-40GB"
    assert by_host["localhost"]["gpus"] is None  # the launcher: no nvidia-smi, nothing shown
    gpu_rows = [row for row in report["job"] if row["name"] == "gpus"]
    assert [(r["status"], r["detail"]) for r in gpu_rows] == [
        ("pass", "2 x NVIDIA A100-SXM4-40GB per host, driver 535.129.03, CUDA 12.2")]

    run = subprocess.run(dtlaunch_argv("run", "-v", *common, "/bin/hostname"),
                         capture_output=True, text=True, env=env, timeout=180)
    assert run.returncode == 0, run.stderr
    assert "dtlaunch: slots: one per NVIDIA GPU on h1:2, h2:2" in run.stderr
    (running,) = [line for line in run.stderr.splitlines() if line.startswith("dtlaunch: running:")]
    assert " -np 4 -H h1:2,h2:2 " in running
    ranks = Counter(line.split("] ", 1)[1] for line in run.stdout.splitlines() if "] " in line)
    assert ranks == {"h1": 2, "h2": 2}

    # Written slots win over the GPUs.
    written = subprocess.run(dtlaunch_argv("run", "-v", "-H", "h1:1,h2:1", "--ssh-config",
                                           str(bed.ssh_config), "/bin/hostname"),
                             capture_output=True, text=True, env=env, timeout=180)
    assert written.returncode == 0, written.stderr
    assert " -np 2 -H h1:1,h2:1 " in written.stderr and "slots:" not in written.stderr
