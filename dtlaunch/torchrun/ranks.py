"""Each worker's torchrun contract, from the plan's rank placement. Pure.

The variables torchrun's agent (torch/distributed/elastic/agent/server/local_elastic_agent.py)
gives every worker; ranks fill the hosts in order, a host's first rank the sum of the workers
before it. MASTER_ADDR and MASTER_PORT come from host 0's agent, which holds the store (they are
known once it has bound them), TORCHELASTIC_ERROR_FILE from each host's agent (a private
directory there); the rest is here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dtlaunch.gloo.ranks import place_ranks

# The user's own value wins for these, as under torchrun.
USER_FIRST = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class Worker:
    rank: int
    host: str
    local_rank: int
    local_world_size: int
    group_rank: int  # the host's index in the job


def place_workers(rank_hosts: Sequence[str]) -> tuple[Worker, ...]:
    """Every worker's place, from the host of each rank (in rank order): a Gloo rank's, with
    its host's index in the job."""
    order = list(dict.fromkeys(rank_hosts))
    return tuple(Worker(r.rank, r.host, r.local_rank, r.local_size, order.index(r.host))
                 for r in place_ranks(rank_hosts))


def worker_env(worker: Worker, world_size: int, group_world_size: int, *, attempt: int,
               max_restarts: int, run_id: str, user_env: Mapping[str, str]) -> dict[str, str]:
    """One worker's variables (without MASTER_ADDR, MASTER_PORT and TORCHELASTIC_ERROR_FILE,
    which its host's agent sets). `user_env`: what the job's environment already sets."""
    env = {
        "RANK": str(worker.rank),
        "LOCAL_RANK": str(worker.local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(worker.local_world_size),
        "GROUP_RANK": str(worker.group_rank),
        "GROUP_WORLD_SIZE": str(group_world_size),
        "ROLE_RANK": str(worker.rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",  # torchrun's only role
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    if worker.local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    for name in USER_FIRST:
        if name in user_env:
            env.pop(name, None)  # the job's environment carries the user's value
    return env


def program_for(program: Sequence[str], local_rank: int, local_rank_arg: str | None,
                ) -> tuple[str, ...]:
    """The worker's argv: `${local_rank}` in an argument replaced by its local rank (torchrun's
    macro), and `OPTION=<local rank>` appended for --local-rank-arg (torch.distributed.launch's
    `--local-rank`, spelled `--local_rank` before PyTorch 2.0)."""
    argv = [word.replace("${local_rank}", str(local_rank)) for word in program]
    if local_rank_arg:
        argv.append(f"{local_rank_arg}={local_rank}")
    return tuple(argv)
