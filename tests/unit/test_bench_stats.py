"""The benchmarks' pure statistics: pairing neighbours against drift, the steady rate; and
that a before/after runs the tree it names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import dtlaunch_argv, sandwiched_ratios, steady_rate


def test_each_run_is_compared_with_its_neighbours_so_a_drift_cancels() -> None:
    # The machine slows from 100 to 80 while the 2-rank runs stay at 1.8x the 1-rank speed.
    seq = [("1", 100.0), ("2", 171.0), ("1", 90.0), ("2", 153.0), ("1", 80.0)]
    assert sandwiched_ratios(seq, "2", "1", scale=2.0) == pytest.approx([0.9, 0.9])
    # A 1-rank median taken at the start alone would have said 162 / 200 = 0.81.


def test_runs_at_the_ends_use_the_one_neighbour_they_have() -> None:
    seq = [("2", 90.0), ("2w", 95.0), ("1", 50.0), ("1", 60.0), ("2w", 120.0)]
    assert sandwiched_ratios(seq, "2w", "1", scale=2.0) == pytest.approx([0.95, 1.0])
    assert sandwiched_ratios([("2", 1.0)], "2", "1") == []


def test_the_steady_rate_leaves_out_the_warm_up_and_weighs_time_not_rates() -> None:
    # Equal intervals of work: at 100 and 300 words/s they take 3:1 of the time -> 150 overall.
    assert steady_rate([10.0, 100.0, 300.0]) == pytest.approx(150.0)
    assert steady_rate([42.0]) == pytest.approx(42.0)  # nothing after the warm-up: keep it


def _lines(rank: int, count: int, tag: str) -> list[bytes]:
    out = []
    for i in range(count):
        head = b"rank %d line %d " % (rank, i)
        out.append(tag.encode() + head + b"x" * (63 - len(head)) + b"\n")
    return out


def test_the_output_check_wants_every_line_whole_under_its_own_tag(tmp_path: Path) -> None:
    from scale_output import check

    hosts = ["h2", "h3"]  # ranks 0, 1 on h2 and 2, 3 on h3
    good = [ln for r in range(4) for ln in _lines(r, 5, f"[{r}@{hosts[r // 2]}] ")]
    path = tmp_path / "out"
    path.write_bytes(b"".join([b"dtlaunch: a launcher line\n", *good]))
    assert check(path, hosts, 5, dtlaunch=True) == "ok"
    wrong_host = [ln.replace(b"[3@h3]", b"[3@h2]") for ln in good]
    path.write_bytes(b"".join(wrong_host))
    assert "5 mistagged" in check(path, hosts, 5, dtlaunch=True)
    cut = [*good[:3], good[3][:20] + b"\n", b"[0@h2] " + good[3][20:], *good[4:]]
    path.write_bytes(b"".join(cut))
    assert check(path, hosts, 5, dtlaunch=True).startswith("1 lines cut by a tag, 0 mistagged, 1 of 4")
    mpi = [ln for r in range(4) for ln in _lines(r, 5, f"[1,{r}]<stdout>:")]
    path.write_bytes(b"".join(mpi))
    assert check(path, hosts, 5, dtlaunch=False) == "ok"
    path.write_bytes(b"".join(mpi[:-1]))  # a line missing
    assert "1 of 4 ranks short" in check(path, hosts, 5, dtlaunch=False)


def test_a_baseline_tree_on_pythonpath_runs_even_from_the_repository_root(tmp_path: Path) -> None:
    # `python -m dtlaunch` from the repository root put the checkout first on sys.path, ahead
    # of the baseline tree on PYTHONPATH: both sides of a before/after ran the checkout.
    import os
    import subprocess

    fake = tmp_path / "dtlaunch"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("print('the baseline tree')\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(dtlaunch_argv(), cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.stdout == "the baseline tree\n", done.stderr


def test_a_run_that_reached_the_cap_counts_as_longer_than_any_figure() -> None:
    from torch_launch import capped

    assert capped([0.5, 0.3, 0.4], 90) == "0.40 (0.30–0.50)"
    assert capped([None, 2.0, 1.0], 90) == "2.00 (1.00–> 90)"
    assert capped([None, None], 90) == "> 90 (> 90–> 90)"
    assert capped([1.0, None], 90) == "> 90 (1.00–> 90)"  # a median half beyond the cap
    assert capped([1.0, 3.0], 90) == "2.00 (1.00–3.00)"


def test_torchrun_by_hand_is_one_ssh_per_host_with_its_node_rank_and_host_0s_address() -> None:
    from types import SimpleNamespace

    from torch_launch import TORCHRUN, torchrun_commands

    hosts = [SimpleNamespace(address=f"10.1.2.{10 + i}") for i in range(3)]
    bed = SimpleNamespace(hosts=hosts, names=["h1", "h2", "h3"], ssh_config="/cfg")
    commands = torchrun_commands(bed, 29511, ["job.py", "--hold", "d"])
    assert [c[:4] for c in commands] == [["ssh", "-F", "/cfg", h] for h in ("h1", "h2", "h3")]
    for i, c in enumerate(commands):
        assert c[4] == (f"cd /tmp && env OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 {TORCHRUN} "
                        f"--nnodes 3 --node-rank {i} --nproc-per-node 1 --master-addr 10.1.2.10 "
                        "--master-port 29511 job.py --hold d")
