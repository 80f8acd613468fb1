"""A rank that proves where it ran. Used by the multi-host tests.

Writes OUT/rank.<rank>.json with its host, argv and environment; options make it fail, sleep
or allreduce with Horovod.
"""

import argparse
import json
import os
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--horovod", action="store_true")
parser.add_argument("--exit-rank", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--wait-for", help="wait until this file exists before anything else")
args, rest = parser.parse_known_args()

if args.wait_for:
    with open(os.path.join(args.out, f"waiting.{os.getpid()}"), "w"):
        pass
    while not os.path.exists(args.wait_for):
        time.sleep(0.05)

if args.horovod:
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()
    layout = [hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]
else:
    # mpirun sets OMPI_COMM_WORLD_*, Hydra's mpiexec PMI_RANK/PMI_SIZE; a direct launch by
    # srun sets SLURM_PROCID/SLURM_NTASKS, dtlaunch's --gloo HOROVOD_RANK/HOROVOD_SIZE.
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK")
               or os.environ.get("SLURM_PROCID") or os.environ["HOROVOD_RANK"])
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE")
               or os.environ.get("SLURM_NTASKS") or os.environ["HOROVOD_SIZE"])
    total = None
    layout = None

record = {
    "rank": rank,
    "size": size,
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "python": sys.executable,
    "argv": sys.argv[1:],
    "rest": rest,
    "env": dict(os.environ),
    "allreduce_sum": total,
    "layout": layout,  # Horovod's local rank and size, cross rank and size
}
with open(os.path.join(args.out, f"rank.{rank}.json"), "w") as handle:
    json.dump(record, handle)
print(f"rank {rank} of {size} on {record['host']}", flush=True)

if rank == args.kill_rank:
    os.kill(os.getpid(), 9)
if rank == args.exit_rank:
    sys.exit(args.exit_code)
if args.sleep:
    time.sleep(args.sleep)
