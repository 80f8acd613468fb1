"""Two ways to start ranks inside a Slurm allocation, on a real Slurm cluster on the test bed.

  mpirun: `salloc -N2 mpirun ...` (Open MPI's plm slurm starts its daemons with srun)
  srun:   `salloc -N2 srun --mpi=pmix -n 4 ...` (direct launch, PMIx)

For each, plain ranks (print one line, write a file) and a Horovod allreduce, repeated; counts
how many runs exited 0, how many rank lines reached stdout, how many rank files were written,
how many hung (killed after the deadline), and the median wall time. Prints one JSON document.
Usage: python bench/slurm_paths.py [PLAIN_RUNS] [HOROVOD_RUNS]
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, log
from helpers.slurm_bed import start_slurm_cluster
from helpers.testbed import build_testbed

PROBE = str(ROOT / "tests" / "scripts" / "rank_probe.py")
NP = 4
DEADLINE = 120.0


def main() -> None:
    plain_runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    hvd_runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    bed = build_testbed(2)
    shared = Path(tempfile.mkdtemp(prefix="dtlaunch-slurm-bench-", dir="/var/tmp"))
    try:
        t0 = time.monotonic()
        cluster = start_slurm_cluster(bed, shared=[shared])
        started = time.monotonic() - t0
        mpirun = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--map-by", "slot",
                  "-np", str(NP), "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
                  "--mca", "btl_tcp_if_include", bed.subnet, "--mca", "oob_tcp_if_include",
                  bed.subnet, "-x", "PATH", "-x", "PYTHONPATH"]
        srun = ["srun", "--mpi=pmix", f"--ntasks={NP}"]
        results = {}
        for name, launcher, extra, runs in (
            ("mpirun plain", mpirun, [], plain_runs), ("srun pmix plain", srun, [], plain_runs),
            ("mpirun horovod", mpirun, ["--horovod"], hvd_runs),
            ("srun pmix horovod", srun, ["--horovod"], hvd_runs),
        ):
            rows = []
            for i in range(runs):
                out = shared / f"{name.replace(' ', '-')}-{i}"
                out.mkdir()
                argv = ["salloc", "--nodes=2", *launcher, sys.executable, PROBE, "--out", str(out), *extra]
                start = time.monotonic()
                try:
                    proc = cluster.run(*argv, timeout=DEADLINE)
                    rc, stdout, hung = proc.returncode, proc.stdout, False
                except Exception as exc:  # subprocess.TimeoutExpired: salloc is killed
                    rc, stdout, hung = None, str(getattr(exc, "stdout", "") or ""), True
                seconds = time.monotonic() - start
                lines = len(re.findall(rf"rank \d+ of {NP} on h\d", stdout))
                files = len(list(out.glob("rank.*.json")))
                sums = {json.loads(p.read_text())["allreduce_sum"] for p in out.glob("rank.*.json")}
                rows.append({"rc": rc, "lines": lines, "files": files, "hung": hung,
                             "seconds": round(seconds, 2), "sums": sorted(map(str, sums))})
                log(f"{name} #{i}: {rows[-1]}")
                cluster.wait_idle(60)
            results[name] = {
                "runs": runs,
                "exit_0": sum(r["rc"] == 0 for r in rows),
                "all_lines": sum(r["lines"] == NP for r in rows),
                "all_files": sum(r["files"] == NP for r in rows),
                "hung": sum(r["hung"] for r in rows),
                "lines_per_run": [r["lines"] for r in rows],
                "median_s": statistics.median(r["seconds"] for r in rows),
                "rows": rows,
            }
        t1 = time.monotonic()
        cluster.stop()
        stopped = time.monotonic() - t1
        print(json.dumps({"cluster_start_s": round(started, 2), "cluster_stop_s": round(stopped, 2),
                          "results": results}, indent=1))
    finally:
        bed.close()
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    main()
