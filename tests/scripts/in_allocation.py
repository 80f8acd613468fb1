"""Runs on this machine inside a Slurm allocation (under salloc or sbatch) for the Slurm tests.

Prints one JSON document on stdout:
  env                    the environment salloc gave and what dtlaunch reads from it
  probe FAIL HANG        dtlaunch's srun probe on every allocated node (FAIL's task exits 3,
                         HANG's never answers: srun is stopped after $PROBE_TIMEOUT seconds)
  mpirun OUT SUBNET ARGS mpirun (Open MPI's plm slurm, no SSH) with only the PATH-like variables
                         plus dtlaunch's SLURM_* launch set, then the ARGS program
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from dtlaunch.cluster.allocation import detect
from dtlaunch.cluster.slurm import build_srun_probe_argv, parse_srun_labeled, parse_srun_task_errors
from dtlaunch.job.env import slurm_launch_env

mode = sys.argv[1]
alloc = detect(os.environ)
assert alloc is not None, "not inside an allocation"
result: dict[str, object] = {"describe": alloc.describe(), "names": list(alloc.names),
                             "slots": [h.slots for h in alloc.hosts]}

if mode == "env":
    result["env"] = {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}
    result["launch_env"] = slurm_launch_env(os.environ)
elif mode == "probe":
    fail, hang = sys.argv[2], sys.argv[3]
    # Each node answers with its own hostname; FAIL's node then exits 3, HANG's node sleeps.
    command = [sys.executable, "-c",
               "import socket, sys, time; name = socket.gethostname(); "
               "time.sleep(600) if name == sys.argv[2] else print('node', name); "
               "print('second line'); sys.exit(3 if name == sys.argv[1] else 0)", fail, hang]
    argv = build_srun_probe_argv(alloc.names, command)
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=float(os.environ.get("PROBE_TIMEOUT", "60")))
        timed_out = False
    except subprocess.TimeoutExpired:
        # What a caller does at its deadline: srun cancels the step on SIGTERM.
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=60)
        timed_out = True
    labeled = parse_srun_labeled(stdout, alloc.names)
    result.update(argv=list(argv), rc=proc.returncode, seconds=time.monotonic() - start,
                  timed_out=timed_out, by_node=dict(labeled.by_node),
                  unlabeled=labeled.unlabeled, errors=parse_srun_task_errors(stderr),
                  stderr=stderr)
elif mode == "mpirun":
    out, subnet, *program = sys.argv[2:]
    env = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH", "LANG") if k in os.environ}
    env.update(slurm_launch_env(os.environ))
    argv = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--map-by", "slot",
            "-np", str(alloc.total_tasks), "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
            "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
            "-x", "PATH", "-x", "PYTHONPATH", *program]
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90)
        result.update(rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr[-3000:])
    except subprocess.TimeoutExpired as exc:
        result.update(rc=None, hung=True, stdout=(exc.stdout or b"").decode(errors="replace"))
    result.update(seconds=time.monotonic() - start, env_names=sorted(env))
else:
    raise SystemExit(f"unknown mode {mode}")

print(json.dumps(result))
