"""Figure 5: recovery time. PTB small trains on 3 test-bed hosts with checkpoints; one host's link
is taken down (`ip link set <its veth> down`: it stops answering, as a machine that lost power
would), and the clock runs until training steps run again on the other 2. Split into:

| phase | from | to |
|---|---|---|
| detection | link down | dtlaunch prints "lost the SSH connection to host X" |
| stopping | that line | the attempt ends (mpirun and every rank gone) |
| re-check | attempt ends | re-check of the remaining hosts done (`recheck_s` in attempts.json) |
| relaunch | next attempt starts | ranks up, Horovod initialised (`up_at` of the start record) |
| data | ranks up | PTB read by rank 0 and sent to all (`data_s`) |
| model build | data loaded | model and optimizer built (the first torch optimizer imports torch._dynamo) |
| checkpoint load | model built | weights read by rank 0 and broadcast (`ready_s` of the resume record) |
| first step | resumed | the first training step logged |
| between | re-check done | next attempt starts (restart delay, planning) |

Goal (issue 13): detection ≤ 20 s, everything after it ≤ 10 s.

Timestamps: every line dtlaunch prints is stamped by this script as it arrives; the attempts
come from `--output-dir/attempts.json` (`started_at`, `ended_at`, `recheck_s`, seconds since the
epoch); the job's own moments from the example's metrics (`time` on every record). One machine,
one clock. Without `dtlaunch run --max-restarts` (before it is wired in), `--manual` plays the
restart loop from outside with the same pieces: the failed `dtlaunch run`, `dtlaunch doctor` on
the remaining hosts as the re-check, and `dtlaunch run --no-check --resume auto` as the restart.

`--checkpoint-only` measures what needs no test bed: the time to write (atomically, fsynced)
and to read a checkpoint of the PTB model, for the small and medium configurations.

    sudo .venv/bin/python bench/recovery_time.py [--reps 3] [--victim h3] [--manual]
    .venv/bin/python bench/recovery_time.py --checkpoint-only [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    bed_of,
    dtlaunch_argv,
    loadavg,
    log,
    md_table,
    save_raw,
    worktree_env,
    write_result,
)

sys.path.insert(0, str(ROOT))  # this checkout's dtlaunch (the checkpoint figures import it)

MODULE = "dtlaunch.examples.ptb_lm"
DEFAULT_DATA = Path(os.environ.get("DTLAUNCH_PTB_DATA", ROOT.parent / "shared" / "data" / "ptb"))
GOAL_DETECTION, GOAL_AFTER = 20.0, 10.0
LOST_LINE = "lost the SSH connection to host"
PHASES = ("detection", "stopping", "re-check", "between", "relaunch", "data", "model build",
          "checkpoint load", "first step")


# --- checkpoint write and read ------------------------------------------------------------------


def checkpoint_times(config_name: str, reps: int, folder: Path) -> dict[str, Any]:
    """Write and read the example's real checkpoint (``save_checkpoint``/``read_checkpoint``)."""
    import torch

    from dtlaunch.examples.ptb_lm import checkpoint, train
    from dtlaunch.examples.ptb_lm.comm import SingleProcess
    from dtlaunch.examples.ptb_lm.config import CONFIGS
    from dtlaunch.examples.ptb_lm.model import PTBModel

    config = CONFIGS[config_name]
    model = PTBModel(config)
    job = train.Job(comm=SingleProcess(), config=config, model=model,
                    optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                    train=torch.zeros(1, 1), streams=range(config.batch_size), loss_scale=1.0,
                    report=train.Reporter(False, None), seed=1)
    pos = checkpoint.Position(epoch=1, epoch_step=100, step=2423,
                              hidden=model.initial_state(config.batch_size))
    path = folder / f"{config_name}.pt"
    saves, loads = [], []
    for _ in range(reps + 1):  # the first round warms the page cache and is dropped
        saves.append(checkpoint.save_checkpoint(job, pos, str(path)))
        started = time.perf_counter()
        checkpoint.read_checkpoint(job, str(path))
        loads.append(time.perf_counter() - started)
    params = sum(p.numel() for p in model.parameters())
    return {"config": config_name, "params": params, "bytes": path.stat().st_size,
            "save": saves[1:], "load": loads[1:]}


def checkpoint_table(reps: int) -> str:
    with tempfile.TemporaryDirectory(prefix="dtlaunch-bench-ckpt-", dir="/var/tmp") as tmp:
        rows = []
        for name in ("small", "medium"):
            r = checkpoint_times(name, reps, Path(tmp))
            log(f"  checkpoint {name}: {r}")
            rows.append([name, f"{r['params'] / 1e6:.1f} M", f"{r['bytes'] / 2**20:.0f} MiB",
                         f"{statistics.median(r['save']):.3f} ({min(r['save']):.3f}–{max(r['save']):.3f})",
                         f"{statistics.median(r['load']):.3f} ({min(r['load']):.3f}–{max(r['load']):.3f})"])
    return "\n".join([
        "### Checkpoint write and read (one process, local ext4 disk)", "",
        f"The example's `save_checkpoint` (temporary file, fsync, rename, directory fsync) and "
        f"`read_checkpoint` (torch.load + load_state_dict), {reps} repetitions after one warm-up; "
        "seconds, median (min–max).", "",
        md_table(["config", "parameters", "file", "write s", "read s"], rows), ""])


# --- the recovery scenario ----------------------------------------------------------------------


class StampedLines:
    """Reads a process's stdout and stderr as they come, stamping each line with time.time()."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, args=(pipe,), daemon=True)
                        for pipe in (proc.stdout, proc.stderr)]
        for thread in self.threads:
            thread.start()

    def _read(self, pipe: Any) -> None:
        for line in iter(pipe.readline, ""):
            with self.lock:
                self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, needle: str) -> float | None:
        with self.lock:
            return next((t for t, text in self.lines if needle in text), None)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(10)


def metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wired() -> bool:
    out = subprocess.run(dtlaunch_argv("run", "--help"), capture_output=True, text=True,
                         env=worktree_env(), timeout=60)
    return "--max-restarts" in out.stdout


def start_job(argv: list[str]) -> tuple[subprocess.Popen[str], StampedLines]:
    proc = subprocess.Popen(argv, env=worktree_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, StampedLines(proc)


def one_recovery(bed: Any, data: Path, victim: str, manual: bool, work: Path,
                 every: int) -> dict[str, Any]:
    hosts = list(bed.names)
    remaining = [h for h in hosts if h != victim]
    ckpt, m, out = work / "ckpt.pt", work / "metrics.jsonl", work / "out"
    common = ["--iface", bed.subnet, "--ssh-config", str(bed.ssh_config)]
    job = ["-m", MODULE, "--config", "small", "--data-path", str(data), "--threads", "1",
           "--checkpoint", str(ckpt), "--checkpoint-every", str(every), "--resume", "auto",
           "--log-interval", "1", "--no-eval", "--max-steps", str(every * 4), "--metrics", str(m)]
    restarts = [] if manual else ["--max-restarts", "1"]
    argv = dtlaunch_argv("run", *restarts, "--output-dir", str(out), "-H",
                         ",".join(f"{h}:1" for h in hosts), *common, *job)
    proc, lines = start_job(argv)
    deadline = time.monotonic() + 900
    while not any(r["event"] == "progress" and r["step"] >= every + 3 for r in metrics(m)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the job ended or stalled before its first checkpoint:\n"
                               + "\n".join(t for _, t in lines.lines[-30:]))
        time.sleep(0.05)
    down_at = time.time()
    bed.set_link(victim, up=False)
    steps_before = max(r["step"] for r in metrics(m) if r["event"] == "progress")
    result: dict[str, Any] = {"down_at": down_at}
    if manual:
        proc.wait(timeout=300)
        lines.join()
        first_end = time.time()
        check_started = time.time()
        doctor = subprocess.run(dtlaunch_argv("doctor", "-H", ",".join(remaining), *common,
                                              "-m", MODULE), env=worktree_env(),
                                capture_output=True, text=True, timeout=300)
        recheck_s = time.time() - check_started
        if doctor.returncode != 0:
            raise RuntimeError("re-check of the remaining hosts failed:\n" + doctor.stdout[-2000:])
        second_start = time.time()
        proc2, lines2 = start_job(dtlaunch_argv("run", "--no-check", "-H",
                                                ",".join(f"{h}:1" for h in remaining),
                                                *common, *job))
        code = proc2.wait(timeout=900)
        lines2.join()
    else:
        code = proc.wait(timeout=1200)
        lines.join()
        attempts = json.loads((out / "attempts.json").read_text())["attempts"]
        if len(attempts) != 2:
            raise RuntimeError(f"expected 2 attempts, got {len(attempts)}")
        first_end, recheck_s = attempts[0]["ended_at"], attempts[1]["recheck_s"]
        second_start = attempts[1]["started_at"]
    if code != 0:
        raise RuntimeError(f"the restarted job exited {code}")
    detected_at = lines.first(LOST_LINE)
    records = metrics(m)
    start2 = next(r for r in records if r["event"] == "start" and r["time"] > second_start)
    resume = next(r for r in records if r["event"] == "resume" and r["time"] > second_start)
    first_step = next(r for r in records if r["event"] == "progress" and r["time"] > resume["time"])
    loaded_at = resume["time"] - resume["ready_s"]
    result.update({
        "detection": (detected_at or first_end) - down_at,
        "stopping": first_end - (detected_at or first_end),
        "re-check": recheck_s,
        "relaunch": start2["up_at"] - second_start,
        "data": start2["data_s"],
        "checkpoint load": resume["ready_s"],
        "first step": first_step["time"] - resume["time"],
        "between": second_start - first_end - recheck_s,
        "model build": loaded_at - start2["up_at"] - start2["data_s"],
        "total": first_step["time"] - down_at,
        "after detection": first_step["time"] - (detected_at or first_end),
        "steps lost": steps_before - resume["step"],
        "detected": detected_at is not None,
    })
    return result


def recovery_table(reps: int, data: Path, victim: str, manual: bool) -> str:
    if not manual and not wired():
        return ("### Recovery after a lost host\n\nNot measured: `dtlaunch run --max-restarts` is "
                "not in this checkout yet; `--manual` plays the restart loop from outside.\n")
    runs = []
    before = loadavg()
    for rep in range(reps):
        with bed_of(3) as bed, tempfile.TemporaryDirectory(prefix="dtlaunch-bench-rec-") as tmp:
            runs.append(one_recovery(bed, data, victim, manual, Path(tmp), every=20))
            log(f"  recovery rep {rep + 1}/{reps}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in runs[-1].items() if isinstance(v, float) and k != "down_at"))
    save_raw("recovery_time", runs)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    rows = [[phase, f"{med(phase):.2f}", f"{min(r[phase] for r in runs):.2f}–"
             f"{max(r[phase] for r in runs):.2f}"] for phase in PHASES]
    rows.append(["**total** (link down → training again)", f"**{med('total'):.2f}**", ""])
    detection, after = med("detection"), med("after detection")
    how = ("outside dtlaunch (`--manual`: failed run, `dtlaunch doctor`, `dtlaunch run --no-check`)"
           if manual else "`dtlaunch run --max-restarts 1`")
    return "\n".join([
        "### Recovery after a lost host", "",
        f"PTB small, 3 hosts × 1 rank, checkpoint every 20 steps, restarted by {how}; "
        f"{victim}'s link taken down 3 steps after the first checkpoint; {reps} run(s), seconds "
        f"(median, min–max); load average {before} → {loadavg()}. Steps trained again after the "
        f"restart: {med('steps lost'):.0f} (median).", "",
        md_table(["phase", "median s", "range s"], rows), "",
        f"Goals: detection ≤ {GOAL_DETECTION:g} s: {detection:.1f} s, "
        f"**{'met' if detection <= GOAL_DETECTION else 'MISSED'}**; everything after it "
        f"≤ {GOAL_AFTER:g} s: {after:.1f} s, **{'met' if after <= GOAL_AFTER else 'MISSED'}**.", ""])


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--victim", default="h3", help="host whose link goes down (h1: rank 0's)")
    parser.add_argument("--manual", action="store_true",
                        help="restart from outside dtlaunch (before --max-restarts exists)")
    parser.add_argument("--checkpoint-only", action="store_true")
    parser.add_argument("--data-path", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    parts = ["## 5. Recovery time", "", checkpoint_table(max(args.reps, 3))]
    if not args.checkpoint_only:
        if not (args.data_path / "ptb.train.txt").is_file():
            parts.append(f"Recovery not measured: no PTB data in {args.data_path}.\n")
        else:
            parts.append(recovery_table(args.reps, args.data_path, args.victim, args.manual))
    return write_result("recovery_time.md", "\n".join(parts))


if __name__ == "__main__":
    main()
