"""Checkpoints and resume of the PTB example: exact, atomic, and with any number of ranks."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from helpers.ptb import PTB_DIR, REPO, mpirun_command, needs_ptb

from dtlaunch.examples.ptb_lm import checkpoint, train
from dtlaunch.examples.ptb_lm.comm import SingleProcess

TINY = ["--batch-size", "4", "--hidden-size", "16", "--keep-prob", "0.7", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_ptb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small corpus in PTB's format (56 steps per epoch at batch 4): epochs take a second."""
    folder = tmp_path_factory.mktemp("tiny-ptb")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)] + ["<unk>"]
    for split, size in (("train", 4000), ("valid", 800), ("test", 800)):
        lines: list[str] = []
        while sum(len(line.split()) for line in lines) < size:
            lines.append(" ".join(rng.choice(words[: rng.randint(5, 41)])
                                  for _ in range(rng.randint(3, 12))))
        (folder / f"ptb.{split}.txt").write_text("".join(f" {line} \n" for line in lines))
    (folder / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256((folder / f'ptb.{s}.txt').read_bytes()).hexdigest()}  ptb.{s}.txt\n"
        for s in ("train", "valid", "test")))
    return folder


def records(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in found if event is None or r["event"] == event]


def digest(prefix: Path) -> str:
    return str(json.loads(Path(f"{prefix}.rank0").read_text())["sha256"])


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train, "get_comm", lambda nice: SingleProcess())
    monkeypatch.delenv("DTLAUNCH_RESTART_COUNT", raising=False)


# ---------------------------------------------------------------- one process, exact


@pytest.mark.slow
@pytest.mark.usefixtures("in_process")
def test_resume_mid_epoch_equals_the_uninterrupted_run_bit_for_bit(
        tiny_ptb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout on, 6 epochs (the learning rate decays after 4), stopped in epoch 3."""
    common = ["--data-path", str(tiny_ptb), *TINY, "--max-epochs", "6"]
    assert train.main([*common, "--metrics", str(tmp_path / "a.jsonl"),
                       "--dump-params", str(tmp_path / "a")]) == 0
    ckpt = tmp_path / "ckpt.pt"
    assert train.main([*common, "--max-steps", "130", "--checkpoint", str(ckpt),
                       "--checkpoint-every", "50", "--metrics", str(tmp_path / "b.jsonl")]) == 0
    saved = torch.load(ckpt, weights_only=True)["position"]
    assert (saved["epoch"], saved["epoch_step"], saved["step"]) == (2, 18, 130)
    assert saved["hidden"] is not None and saved["interval_tokens"] > 0
    monkeypatch.setenv("DTLAUNCH_RESTART_COUNT", "1")
    assert train.main([*common, "--checkpoint", str(ckpt), "--resume",
                       "--metrics", str(tmp_path / "c.jsonl"), "--dump-params", str(tmp_path / "c")]) == 0
    assert digest(tmp_path / "a") == digest(tmp_path / "c")
    whole, resumed = records(tmp_path / "a.jsonl", "epoch"), records(tmp_path / "c.jsonl", "epoch")
    assert [(r["train_ppl"], r["valid_ppl"], r["lr"]) for r in whole[2:]] == \
        [(r["train_ppl"], r["valid_ppl"], r["lr"]) for r in resumed]
    assert records(tmp_path / "a.jsonl", "final")[0]["test_ppl"] == \
        records(tmp_path / "c.jsonl", "final")[0]["test_ppl"]
    start = records(tmp_path / "c.jsonl", "start")[0]
    assert start["restart_count"] == 1
    resume = records(tmp_path / "c.jsonl", "resume")[0]
    assert (resume["epoch"], resume["epoch_step"], resume["step"]) == (3, 18, 130)


@pytest.mark.usefixtures("in_process")
def test_resume_required_without_a_checkpoint_is_one_line_exit_2(
        tiny_ptb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--data-path", str(tiny_ptb), *TINY, "--checkpoint", str(tmp_path / "none.pt")]
    assert train.main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume: no checkpoint at" in err and "--resume auto" in err


@pytest.mark.usefixtures("in_process")
def test_resume_auto_without_a_checkpoint_starts_from_the_beginning(
        tiny_ptb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "c.pt"
    args = ["--data-path", str(tiny_ptb), *TINY, "--checkpoint", str(ckpt), "--max-steps", "3",
            "--no-eval"]
    assert train.main([*args, "--resume", "auto"]) == 0
    assert f"no checkpoint at {ckpt}: starting from the beginning" in capsys.readouterr().out
    assert torch.load(ckpt, weights_only=True)["position"]["step"] == 3
    assert train.main([*args, "--resume", "auto", "--max-steps", "5"]) == 0
    assert "resumed from" in capsys.readouterr().out


@pytest.mark.usefixtures("in_process")
def test_resume_with_other_options_is_refused(tiny_ptb: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "c.pt"
    args = ["--data-path", str(tiny_ptb), *TINY, "--checkpoint", str(ckpt), "--no-eval"]
    assert train.main([*args, "--max-steps", "2"]) == 0
    capsys.readouterr()
    assert train.main([*args, "--resume", "--batch-size", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "written with batch_size 4, this run has 5; give the same options" in err


@pytest.mark.usefixtures("in_process")
def test_a_checkpoint_directory_that_does_not_exist_fails_before_training(
        tiny_ptb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no" / "c.pt"
    assert train.main(["--data-path", str(tiny_ptb), *TINY, "--checkpoint", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "does not exist" in captured.err
    assert "step" not in captured.out


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.pt"
    checkpoint.write_atomically(path, lambda handle: torch.save({"format": 2, "n": 1}, handle))
    real_save = torch.save

    def save_half_then_fail(obj: object, handle: Any) -> None:
        real_save(obj, handle)
        handle.truncate(10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", save_half_then_fail)
    with pytest.raises(OSError, match="No space"):
        checkpoint.write_atomically(path, lambda handle: torch.save({"format": 2, "n": 2}, handle))
    assert torch.load(path, weights_only=True) == {"format": 2, "n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_bad_checkpoint_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--checkpoint-every", "5"], ["--checkpoint", "c.pt", "--checkpoint-every", "0"],
                 ["--resume", "auto"], ["--keep-prob", "0"]):
        with pytest.raises(SystemExit) as exc:
            train.parse_args(argv)
        assert exc.value.code == 2
    assert train.parse_args(["--checkpoint", "c", "--resume"]).resume == "required"


# ---------------------------------------------------------------- several ranks (Horovod)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.usefixtures("horovod")
def test_dropout_masks_do_not_depend_on_the_number_of_ranks(tiny_ptb: Path, tmp_path: Path) -> None:
    common = ["--data-path", str(tiny_ptb), *TINY, "--keep-prob", "0.5", "--max-steps", "6",
              "--no-eval"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for np_, name in ((1, "one"), (2, "two")):
        done = subprocess.run([*mpirun_command(np_), *common, "--dump-params", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
        assert done.returncode == 0, done.stdout + done.stderr
    one, two = torch.load(tmp_path / "one.rank0.pt"), torch.load(tmp_path / "two.rank0.pt")
    assert (one - two).abs().max().item() < 1e-5


# The short configuration of the interrupted-and-resumed runs on the real corpus.
SHORT = ["--config", "small", "--hidden-size", "32", "--threads", "1", "--log-interval", "10"]
TOTAL_STEPS = 40


def dtlaunch_run(np_: int, *args: str, dtlaunch_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "dtlaunch", "run", "-np", str(np_), "--no-check", *dtlaunch_args,
            "-m", "dtlaunch.examples.ptb_lm", "--data-path", str(PTB_DIR), *SHORT, *args]


def run_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DTLAUNCH_RESTART_COUNT", None)
    return env


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    metrics = folder / "m.jsonl"
    done = subprocess.run(dtlaunch_run(2, "--max-steps", str(TOTAL_STEPS), "--metrics", str(metrics),
                                       "--dump-params", str(folder / "p")),
                          capture_output=True, text=True, timeout=600, env=run_env(), cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {"final": records(metrics, "final")[0], "params": torch.load(folder / "p.rank0.pt")}


def kill_after_checkpoint(argv: list[str], metrics: Path, after_step: int) -> int:
    """Start the job, SIGKILL every rank once a checkpoint at ``after_step`` or later is
    written, and return the launcher's exit status."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=run_env(), cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 400
    try:
        while not any(r["step"] >= after_step for r in records(metrics, "checkpoint")):
            assert proc.poll() is None, f"the job ended (status {proc.returncode}) before a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 400 s"
            time.sleep(0.05)
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "dtlaunch.examples.ptb_lm" in " ".join(p.cmdline())]
        assert ranks, "no rank process found"
        for rank in ranks:
            rank.send_signal(signal.SIGKILL)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
@pytest.mark.horovod
@needs_ptb
@pytest.mark.usefixtures("horovod")
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_killed_and_resumed_with_other_ranks_reaches_the_same_perplexity(
        uninterrupted: dict[str, Any], tmp_path: Path, before: int, after: int) -> None:
    ckpt, metrics = tmp_path / "ckpt.pt", tmp_path / "m.jsonl"
    # The same command line both times (as dtlaunch --max-restarts would run it); the first
    # attempt is killed long before its step limit.
    status = kill_after_checkpoint(
        dtlaunch_run(before, "--checkpoint", str(ckpt), "--checkpoint-every", "10",
                     "--resume", "auto", "--max-steps", "100000", "--metrics", str(metrics)),
        metrics, after_step=10)
    assert status != 0 and not records(metrics, "final")
    resumed = subprocess.run(
        dtlaunch_run(after, "--checkpoint", str(ckpt), "--resume", "auto", "--max-steps",
                     str(TOTAL_STEPS), "--metrics", str(metrics), "--dump-params", str(tmp_path / "p"),
                     dtlaunch_args=("-x", "DTLAUNCH_RESTART_COUNT=1")),
        capture_output=True, text=True, timeout=600, env=run_env(), cwd=REPO)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    resume = records(metrics, "resume")[0]
    assert resume["ranks_before"] == before and resume["ranks"] == after
    assert 10 <= resume["step"] < TOTAL_STEPS and resume["epoch_step"] == resume["step"]
    assert "restart 1" in resumed.stdout
    final, base = records(metrics, "final")[0], uninterrupted["final"]
    assert final["steps"] == TOTAL_STEPS
    assert abs(final["test_ppl"] / base["test_ppl"] - 1) < 0.01
    assert abs(final["train_ppl"] / base["train_ppl"] - 1) < 0.01
    drift = (torch.load(tmp_path / "p.rank0.pt") - uninterrupted["params"]).abs().max().item()
    print(f"{before}->{after} ranks, resumed at step {resume['step']}: test ppl "
          f"{final['test_ppl']:.6f} vs {base['test_ppl']:.6f} uninterrupted; train ppl "
          f"{final['train_ppl']:.6f} vs {base['train_ppl']:.6f}; max |param diff| {drift:.3g}")
    assert drift < 0.02  # 1 rank vs 2 ranks, uninterrupted, differ by ~0.007 here
