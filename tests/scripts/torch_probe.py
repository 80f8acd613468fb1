"""A torch.distributed worker for the tests: records its torchrun contract and what an
all_reduce gave (one JSON file per rank in --out), then exits with --exit-code on --fail-rank."""

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
         "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
         "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
         "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME",
         "NCCL_SOCKET_IFNAME", "SLURM_STEP_ID", "SLURM_PROCID")


@record
def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--fail-attempt", type=int, default=-1)
    parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    record = {name: os.environ.get(name) for name in NAMES}
    record.update(host=socket.gethostname(), pid=os.getpid(), sum=value.item(),
                  local_rank_arg=args.local_rank, launched=dist.is_torchelastic_launched(),
                  argv=sys.argv[1:])
    with open(os.path.join(args.out, f"rank.{rank}.json"), "w") as f:
        json.dump(record, f)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(args.out, f"attempt{attempt}.rank{rank}"), "w") as f:
        f.write(f"{socket.gethostname()} {os.environ.get('TORCHELASTIC_RUN_ID')}\n")
    if rank == args.fail_rank and args.fail_attempt in (-1, attempt):
        print(f"rank {rank} fails on purpose", file=sys.stderr, flush=True)
        return args.exit_code
    if rank == args.raise_rank:
        raise RuntimeError(f"boom on rank {rank}")
    time.sleep(args.sleep)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
