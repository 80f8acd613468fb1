"""Rank-shim records as a rank's shim writes them, for the tests that feed them to a reader."""

from __future__ import annotations

from dtlaunch.agents.rank_shim import HEADER_MAX, PIPE_BUF, records

CHUNK = (PIPE_BUF - HEADER_MAX) // 2  # payload bytes that always fit one PIPE_BUF record


def record(rank: int, kind: str, payload: bytes) -> bytes:
    """One record, whatever its size."""
    (one,) = records(rank, kind, payload, 1 << 40)
    return one
