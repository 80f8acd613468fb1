"""An elastic Horovod worker for the recovery benchmarks: small steps (one allreduce each, a
commit every step), each logged as one JSON line in OUT/steps.jsonl with the wall time, rank,
size and host, until OUT/stop exists (then every worker returns)."""

import json
import os
import sys
import time

import horovod.torch as hvd
import torch
from horovod.common.elastic import ObjectState

out = sys.argv[1]
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
hvd.init()
state = ObjectState(hvd.broadcast_object, hvd.rank, step=0)
host = os.environ.get("HOROVOD_HOSTNAME", "?")


@hvd.elastic.run
def train(state):
    while True:
        stop = torch.tensor([1.0 if os.path.exists(os.path.join(out, "stop")) else 0.0])
        if hvd.allreduce(stop, op=hvd.Max).item() > 0:
            return
        hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
        with open(os.path.join(out, "steps.jsonl"), "a") as handle:
            handle.write(json.dumps({"t": time.time(), "step": state.step, "rank": hvd.rank(),
                                     "size": hvd.size(), "host": host}) + "\n")
        time.sleep(pause)
        state.step += 1
        state.commit()


train(state)
