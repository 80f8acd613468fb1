"""Figure: the output demultiplexer's CPU per MB, in process (no MPI, no hosts): 64 ranks' tagged
records as mpirun's `--tag-output` stream, 40 lines of 100 bytes per chunk, fed to JobOutput in
reads of 64 KiB with the console on /dev/null. Side by side in one run, each variant in a child
process of its own, taking turns: this checkout showing every rank, this checkout with
`--ranks 0`, and with `--baseline REV` dtlaunch as of REV (every rank). Medians and minimums of
the children's CPU time.

    python bench/demux_cpu.py [--reps 9] [--mb 26] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, time
from dtlaunch.agents.rank_shim import records
from dtlaunch.run.job_output import JobOutput
ranks, mb, show_one = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
line = b"x" * 99 + b"\n"
chunk = [b"[1,%d]<stdout>:" % r + records(r, "o", line * 40, 1 << 20)[0] for r in range(ranks)]
rounds = max(1, int(mb * 1e6 / sum(map(len, chunk))))
data = b"".join(chunk) * rounds
kw = {"shown": frozenset({0})} if show_one else {}
with open(os.devnull, "wb") as null:
    job = JobOutput(tuple(f"h{r // 8}" for r in range(ranks)), None, stdout=null, stderr=null, **kw)
    start = time.process_time()
    for at in range(0, len(data), 65536):
        job.feed(data[at:at + 65536], False)
    job.close()
    spent = time.process_time() - start
print(json.dumps({"mb": len(data) / 1e6, "cpu_s": spent}))
"""


def one(pythonpath: str, ranks: int, mb: float, show_one: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(ranks), str(mb), "1" if show_one else "0"],
                          capture_output=True, text=True, env=env, timeout=600, check=True)
    return dict(json.loads(done.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--mb", type=float, default=26.0)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--baseline", help="also dtlaunch as of this git revision")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"every rank": (str(REPO), False), "--ranks 0": (str(REPO), True)}
        if args.baseline:
            archive = Path(tmp) / "base.tar"
            subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), args.baseline,
                            "dtlaunch"], check=True, timeout=120)
            with tarfile.open(archive) as tar:
                tar.extractall(Path(tmp) / "base", filter="data")
            variants[f"{args.baseline}, every rank"] = (str(Path(tmp) / "base"), False)
        times: dict[str, list[float]] = {name: [] for name in variants}
        size = 0.0
        for _ in range(args.reps):  # taking turns: a busy machine slows each alike
            for name, (path, show_one) in variants.items():
                result = one(path, args.ranks, args.mb, show_one)
                size = result["mb"]
                times[name].append(result["cpu_s"] / result["mb"] * 1000)
    print(f"{args.ranks} ranks, {size:.1f} MB, {args.reps} runs each; CPU ms per MB")
    print("| variant | median | min |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} |")


if __name__ == "__main__":
    main()
