"""torch.distributed jobs across hosts (`dtlaunch run --torch`): torchrun's worker contract,
with a store that is the job's alone."""
