"""Pre-flight checks before a launch (filled in with doctor)."""

from __future__ import annotations

from typing import Any


def run_preflight(request: Any, plan: Any, mpirun: str | None, verbose: bool = False) -> None:
    return None
