"""The bundled PTB model on 2 test-bed hosts through dtlaunch: it trains, the ranks stay
identical on different data, and Horovod's threads are lowered."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.ptb import PTB_DIR, needs_ptb
from helpers.suite import dtlaunch_argv
from helpers.testbed import TestBed

pytestmark = [pytest.mark.testbed, pytest.mark.horovod]


@needs_ptb
def test_ptb_small_two_hosts_loss_falls_params_identical_data_sharded(
    bed: TestBed, tmp_path: Path, horovod: None
) -> None:
    metrics, params, shard = tmp_path / "m.jsonl", tmp_path / "params", tmp_path / "shard"
    argv = dtlaunch_argv(
        "run", "-H", "h1:1,h2:1", "--iface", bed.subnet, "--ssh-config", str(bed.ssh_config),
        "-m", "dtlaunch.examples.ptb_lm", "--config", "small", "--data-path", str(PTB_DIR),
        "--max-steps", "200", "--log-interval", "50", "--no-eval", "--threads", "1",
        "--metrics", str(metrics), "--dump-params", str(params), "--dump-shard", str(shard),
    )
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    ppl = [r["train_ppl"] for r in records if r["event"] == "progress"]
    assert len(ppl) == 4
    assert ppl[-1] < 0.6 * ppl[0], ppl  # the loss falls
    digests = [json.loads(Path(f"{params}.rank{r}").read_text()) for r in (0, 1)]
    assert digests[0]["sha256"] == digests[1]["sha256"]  # identical parameters on both hosts
    shards = [json.loads(Path(f"{shard}.rank{r}").read_text()) for r in (0, 1)]
    assert shards[0]["streams"] == list(range(10)) and shards[1]["streams"] == list(range(10, 20))
    assert shards[0]["first_tokens"] != shards[1]["first_tokens"]  # ranks saw different data
    # The ranks really ran on the two hosts.
    assert "[0@h1]" in result.stdout and "2 rank(s)" in result.stdout
    # Horovod's threads were found and lowered (read back from the kernel, not assumed).
    assert "communication threads at nice 19" in result.stdout


@needs_ptb
def test_ptb_small_under_torch_distributed_on_two_hosts(bed: TestBed, tmp_path: Path) -> None:
    """The bundled model with --backend ddp under `dtlaunch run --torch`: DDP over Gloo on two
    hosts, the loss falls and both hosts end with the same parameters."""
    metrics, params = tmp_path / "m.jsonl", tmp_path / "params"
    argv = dtlaunch_argv(
        "run", "--torch", "-H", "h1:1,h2:1", "--iface", bed.subnet, "--ssh-config",
        str(bed.ssh_config), "-m", "dtlaunch.examples.ptb_lm", "--backend", "ddp", "--config",
        "small", "--data-path", str(PTB_DIR), "--max-steps", "200", "--log-interval", "50",
        "--no-eval", "--threads", "1", "--metrics", str(metrics), "--dump-params", str(params),
    )
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    ppl = [r["train_ppl"] for r in records if r["event"] == "progress"]
    assert len(ppl) == 4 and ppl[-1] < 0.6 * ppl[0], ppl
    digests = [json.loads(Path(f"{params}.rank{r}").read_text()) for r in (0, 1)]
    assert digests[0]["sha256"] == digests[1]["sha256"]
    assert "[1@h2]" in result.stdout or "[0@h1]" in result.stdout
