"""Figure 4 (hook): PTB small words/s, 1 rank with all cores vs 2 ranks with one core each, both
through `dtlaunch run`, alternating. Skipped when the example (`dtlaunch.examples.ptb_lm`) or the
data is not there.

    python bench/ptb_scaling.py [--max-steps 200] [--reps 1] [--data-path DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    ROOT,
    dtlaunch_argv,
    loadavg,
    log,
    md_table,
    timed,
    worktree_env,
    write_result,
)

GOAL = 1.2  # words/s of 2 ranks / words/s of 1 rank
MODULE = "dtlaunch.examples.ptb_lm"
DEFAULT_DATA = Path(os.environ.get("DTLAUNCH_PTB_DATA", ROOT.parent / "shared" / "data" / "ptb"))


def available(data: Path) -> str | None:
    """Why the figure cannot run here, or None."""
    env = worktree_env()
    found = subprocess.run([PYTHON, "-c", f"import importlib.util, sys; "
                            f"sys.exit(0 if importlib.util.find_spec({MODULE!r}) else 1)"],
                           env=env, capture_output=True)
    if found.returncode != 0:
        return f"{MODULE} is not in this checkout yet"
    if not (data / "ptb.train.txt").is_file():
        return f"no PTB data in {data}"
    return None


def train_words(data: Path) -> int:
    with open(data / "ptb.train.txt", encoding="utf-8") as handle:
        return sum(len(line.split()) + 1 for line in handle)  # words + <eos>


def one_run(np: int, threads: int, steps: int, data: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dtlaunch-bench-ptb-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        argv = dtlaunch_argv("run", "-np", str(np), "-x", f"OMP_NUM_THREADS={threads}",
                             "-m", MODULE, "--threads", str(threads), "--max-steps", str(steps),
                             "--no-eval", "--data-path", str(data), "--metrics", str(metrics))
        sample = timed(argv, env=worktree_env(), timeout=3600, watch_rss=True)
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    final = next(r for r in reversed(records) if r.get("event") == "final")
    return {"words_per_sec": float(final["words_per_sec"]), "train_ppl": final.get("train_ppl"),
            "wall": sample.seconds, "launcher_rss_mib": sample.peak_rss_kib / 1024}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--data-path", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    why = available(args.data_path)
    if why:
        text = f"## 4. Training scaling (PTB small)\n\nNot measured: {why}.\n"
        log(text)
        return text
    before = loadavg()
    runs: dict[str, list[dict[str, Any]]] = {"1 rank × 2 threads": [], "2 ranks × 1 thread": []}
    for rep in range(args.reps):
        for name, (np, threads) in (("1 rank × 2 threads", (1, 2)), ("2 ranks × 1 thread", (2, 1))):
            runs[name].append(one_run(np, threads, args.max_steps, args.data_path))
            log(f"  ptb rep {rep + 1}: {name}: {runs[name][-1]}")
    words = train_words(args.data_path)
    rows = []
    wps = {name: statistics.median(r["words_per_sec"] for r in rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        rows.append([name, f"{wps[name]:,.0f}", f"{words / wps[name]:.0f}",
                     f"{rs[-1]['train_ppl']:.1f}", f"{wps[name] / wps['1 rank × 2 threads']:.2f}"])
    scale = wps["2 ranks × 1 thread"] / wps["1 rank × 2 threads"]
    text = "\n".join([
        "## 4. Training scaling (PTB small)", "",
        f"`dtlaunch run -np N -m {MODULE} --threads T --max-steps {args.max_steps} --no-eval`, "
        f"{args.reps} run(s) each, alternating; load average {before} → {loadavg()}. "
        "Seconds per epoch are extrapolated from words/s over the training set's "
        f"{words:,} words.", "",
        md_table(["setup", "words/s", "s / epoch (est.)", f"train ppl after {args.max_steps} steps",
                  "× 1 rank"], rows), "",
        f"Goal: 2 ranks ≥ {GOAL} × 1 rank: {scale:.2f}, **{'met' if scale >= GOAL else 'MISSED'}**.", ""])
    return write_result("ptb_scaling.md", text)


if __name__ == "__main__":
    main()
