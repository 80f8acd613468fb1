"""Turn the PTB reproduction runs' metrics into a results table and a validation-perplexity plot.

The runs themselves (13 epochs of the small configuration, 1 rank and 2 ranks) are made with
the commands printed in the table; this script only reads their `--metrics` JSON lines.

    python bench/ptb_report.py runs/ptb-small-1rank.jsonl runs/ptb-small-2ranks.jsonl \
        --out bench/results
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    start = next(r for r in records if r["event"] == "start")
    epochs = [r for r in records if r["event"] == "epoch"]
    final = next((r for r in records if r["event"] == "final"), None)
    return {"path": path, "ranks": start["ranks"], "threads": start["threads"], "epochs": epochs,
            "final": final}


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table(runs: list[dict[str, Any]]) -> str:
    rows = ["| run | epochs | train ppl | valid ppl | test ppl | time/epoch s (median) | words/s |",
            "|---|---|---|---|---|---|---|"]
    for run in runs:
        final, epochs = run["final"], run["epochs"]
        times = [e["epoch_time_s"] for e in epochs]
        rows.append(
            f"| {run['ranks']} rank(s) x {run['threads']} thread(s) | {len(epochs)} | "
            f"{fmt(final and final['train_ppl'])} | {fmt(final and final['valid_ppl'])} | "
            f"{fmt(final and final['test_ppl'])} | {fmt(statistics.median(times) if times else None, 1)} | "
            f"{fmt(final and final['words_per_sec'], 0)} |"
        )
    return "\n".join(rows)


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        xs = [e["epoch"] for e in run["epochs"]]
        ys = [e["valid_ppl"] for e in run["epochs"]]
        ax.plot(xs, ys, marker="o", label=f"{run['ranks']} rank(s) x {run['threads']} thread(s)")
    ax.axhline(121.39, color="grey", linestyle=":", label="TF tutorial final valid (121.39)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation perplexity")
    ax.set_yscale("log")
    ax.set_title("PTB small (Zaremba et al.), Horovod through dtlaunch")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    runs = [load(p) for p in args.metrics]
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(runs)
    (args.out / "ptb_small.md").write_text(text + "\n")
    plot(runs, args.out / "ptb_small_valid_ppl.png")
    print(text)
    finals = [r["final"]["test_ppl"] for r in runs if r["final"]]
    if len(finals) == 2:
        print(f"test perplexity difference: {abs(finals[0] - finals[1]) / min(finals) * 100:.2f} %")


if __name__ == "__main__":
    main()
