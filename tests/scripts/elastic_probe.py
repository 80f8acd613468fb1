"""An elastic Horovod worker that records where each epoch ran. Used by the elastic tests.

Each epoch: one allreduce of (rank + 1) over the job, then a JSON line per worker in
OUT/epochs.jsonl: {epoch, rank, size, host, sum, worker}. Rank 0 then writes the discovery
file for the next epoch from --hosts-at (a JSON list: one list of HOST:SLOTS lines per epoch;
the last one stays), so the discovery script (`cat`-like) sees the schedule. --fail-at
EPOCH:RANK makes that rank exit 3 once (the first time it reaches that epoch at that rank).
"""

import argparse
import json
import os
import socket
import sys
import time

import horovod.torch as hvd
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--epoch-seconds", type=float, default=2.0)
parser.add_argument("--hosts-at", default="")
parser.add_argument("--discovery-file", default="")
parser.add_argument("--fail-at", default="")
args = parser.parse_args()

schedule = json.loads(args.hosts_at) if args.hosts_at else []
hvd.init()
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
state = hvd.elastic.TorchState(model, optimizer, epoch=0)


def log(record):
    with open(os.path.join(args.out, "epochs.jsonl"), "a") as handle:
        handle.write(json.dumps(record) + "\n")


def publish(epoch):
    if not schedule or not args.discovery_file:
        return
    lines = schedule[min(epoch, len(schedule) - 1)]
    tmp = args.discovery_file + ".tmp"
    with open(tmp, "w") as handle:
        handle.write("".join(line + "\n" for line in lines))
    os.replace(tmp, args.discovery_file)


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        epoch = state.epoch
        if args.fail_at:
            fail_epoch, fail_rank = (int(v) for v in args.fail_at.split(":"))
            marker = os.path.join(args.out, "failed.once")
            if epoch == fail_epoch and hvd.rank() == fail_rank and not os.path.exists(marker):
                open(marker, "w").close()
                sys.stdout.flush()
                os._exit(3)
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
        log({"epoch": epoch, "rank": hvd.rank(), "size": hvd.size(), "sum": total,
             "host": os.environ.get("HOROVOD_HOSTNAME", socket.gethostname()),
             "worker": int(os.environ.get("DTLAUNCH_WORKER", "-1"))})
        if hvd.rank() == 0:
            publish(epoch + 1)
        time.sleep(args.epoch_seconds)
        state.epoch += 1
        state.commit()


train(state)
print(f"done rank {hvd.rank()} of {hvd.size()}", flush=True)
