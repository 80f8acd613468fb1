"""--torch's pure parts: torchrun's worker contract, its options, the argv of each worker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.core.errors import UsageError
from dtlaunch.jobkind import KINDS, kind_for
from dtlaunch.plan.plan import RunRequest
from dtlaunch.torchrun.options import (
    GPU,
    parse_local_rank_arg,
    parse_master_port,
    parse_nproc_per_node,
)
from dtlaunch.torchrun.ranks import place_workers, program_for, worker_env


def test_workers_fill_the_hosts_in_order_with_torchruns_places() -> None:
    workers = place_workers(["h1", "h1", "h2", "h3", "h3", "h3"])
    assert [(w.rank, w.host, w.local_rank, w.local_world_size, w.group_rank) for w in workers] == [
        (0, "h1", 0, 2, 0), (1, "h1", 1, 2, 0), (2, "h2", 0, 1, 1),
        (3, "h3", 0, 3, 2), (4, "h3", 1, 3, 2), (5, "h3", 2, 3, 2)]


def test_a_workers_environment_is_torchruns_exactly() -> None:
    worker = place_workers(["h1", "h1", "h2"])[1]
    env = worker_env(worker, 3, 2, attempt=1, max_restarts=2, run_id="dtlaunch-x", user_env={})
    assert env == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "3",
        "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RUN_ID": "dtlaunch-x",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1"}
    # One worker on its host: torchrun sets no OMP_NUM_THREADS; the user's values win.
    alone = place_workers(["h1", "h1", "h2"])[2]
    env = worker_env(alone, 3, 2, attempt=0, max_restarts=0, run_id="r",
                     user_env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert "OMP_NUM_THREADS" not in env and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env
    crowded = place_workers(["h1", "h1"])[0]
    assert "OMP_NUM_THREADS" not in worker_env(crowded, 2, 1, attempt=0, max_restarts=0,
                                               run_id="r", user_env={"OMP_NUM_THREADS": "4"})


@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=40))
def test_ranks_and_sizes_add_up(hosts: list[str]) -> None:
    ordered = sorted(hosts, key=lambda h: hosts.index(h))  # hosts filled in order
    workers = place_workers(ordered)
    assert [w.rank for w in workers] == list(range(len(ordered)))
    for w in workers:
        assert w.local_world_size == ordered.count(w.host)
        assert 0 <= w.local_rank < w.local_world_size
        first = ordered.index(w.host)
        assert w.rank == first + w.local_rank  # a host's first rank: the workers before it
    assert sorted({w.group_rank for w in workers}) == list(range(len(set(ordered))))


def test_each_workers_argv_gets_its_local_rank() -> None:
    program = ("python", "train.py", "--log", "out/${local_rank}.log")
    assert program_for(program, 2, None) == ("python", "train.py", "--log", "out/2.log")
    assert program_for(program, 1, "--local_rank")[-1] == "--local_rank=1"
    assert program_for(program, 0, "--local-rank")[-1] == "--local-rank=0"


def test_torchs_options_are_read_strictly() -> None:
    assert parse_nproc_per_node("4") == 4 and parse_nproc_per_node("GPU") == GPU
    assert parse_nproc_per_node(None) is None
    for bad in ("0", "-1", "²", "auto", "1e3", "99999"):
        with pytest.raises(UsageError, match="--nproc-per-node"):
            parse_nproc_per_node(bad)
    assert parse_local_rank_arg("--local_rank") == "--local_rank"
    for bad in ("local-rank", "--x y", "--a=1", "-", ""):
        with pytest.raises(UsageError, match="--local-rank-arg"):
            parse_local_rank_arg(bad)
    assert parse_master_port(29500) == 29500 and parse_master_port(None) is None
    for port in (0, 65536, -3):
        with pytest.raises(UsageError, match="--master-port"):
            parse_master_port(port)


def test_the_registry_maps_every_request_to_its_kind() -> None:
    base = RunRequest(hosts=(), python="python3")
    from dataclasses import replace

    from dtlaunch.job.elastic import elastic_spec

    spec = elastic_spec(1, 2, None, None, None, None, None, None, True)
    names = {kind_for(r).name for r in (base, replace(base, controller="gloo"),
                                        replace(base, controller="torch"),
                                        replace(base, controller="gloo", elastic=spec))}
    assert names == set(KINDS) == {"mpi", "gloo", "elastic", "torch"}
