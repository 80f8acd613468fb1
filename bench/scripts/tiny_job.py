"""The job every launcher starts in the launch-overhead benchmark: Horovod init + one allreduce."""

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
assert total == hvd.size(), (total, hvd.size())
if hvd.rank() == 0:
    print(f"allreduce over {hvd.size()} ranks: {total:g}", flush=True)
