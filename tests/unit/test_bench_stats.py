"""The benchmarks' pure statistics: pairing neighbours against drift, the steady rate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import sandwiched_ratios, steady_rate


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
