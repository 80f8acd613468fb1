"""The job both launchers start in bench/torch_launch.py: torch.distributed over Gloo (CPU),
init + one all_reduce. With --hold DIR each worker then writes DIR/ready.RANK (its pid) and
keeps working: one all_reduce every --step seconds, for --hold-for seconds at most, as a
training loop would; the benchmark kills one of them mid-job."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--hold", help="directory for the ready files; keep working after them")
parser.add_argument("--step", type=float, default=0.1, help="seconds between two all_reduces")
parser.add_argument("--hold-for", type=float, default=600.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([1.0])
dist.all_reduce(total)
assert total.item() == size, (total.item(), size)
if args.hold:
    with open(os.path.join(args.hold, f"ready.{rank}"), "w") as f:
        f.write(f"{os.getpid()}\n")
    ends = time.monotonic() + args.hold_for
    while time.monotonic() < ends:
        time.sleep(args.step)
        dist.all_reduce(torch.tensor([1.0]))
elif rank == 0:
    print(f"all_reduce over {size} ranks: {total.item():g}", flush=True)
dist.destroy_process_group()
sys.exit(0)
