"""Elastic jobs in tests: a discovery script that follows a schedule the workers publish
(tests/scripts/elastic_probe.py), and the epochs they recorded."""

from __future__ import annotations

import json
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
PROBE = str(SCRIPTS / "elastic_probe.py")


def discovery(tmp_path: Path, first: list[str]) -> tuple[Path, Path]:
    """(the script, the file it prints): the workers rewrite the file as the schedule says."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(line + "\n" for line in first))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec cat {hosts}\n")
    script.chmod(0o755)
    return script, hosts


def probe_args(tmp_path: Path, hosts: Path, schedule: list[list[str]], *more: str) -> list[str]:
    return [PROBE, "--out", str(tmp_path), "--discovery-file", str(hosts),
            "--hosts-at", json.dumps(schedule), *more]


def epochs(tmp_path: Path) -> dict[int, list[dict[str, object]]]:
    """epoch -> its records (the last pass of each epoch: a reset may repeat one)."""
    found: dict[int, list[dict[str, object]]] = {}
    path = tmp_path / "epochs.jsonl"
    for line in path.read_text().splitlines() if path.exists() else ():
        record = json.loads(line)
        found.setdefault(int(record["epoch"]), []).append(record)
    return found


def last_pass(records: list[dict[str, object]]) -> list[dict[str, object]]:
    size = int(records[-1]["size"])  # type: ignore[call-overload]
    return records[-size:]


def check_consistent(found: dict[int, list[dict[str, object]]]) -> None:
    """Every epoch's last pass has each rank once, and its allreduce summed 1..size."""
    for epoch, records in found.items():
        done = last_pass(records)
        size = int(done[0]["size"])  # type: ignore[call-overload]
        assert sorted(int(r["rank"]) for r in done) == list(range(size)), (epoch, records)  # type: ignore[call-overload]
        assert all(r["sum"] == size * (size + 1) / 2 for r in done), (epoch, records)


def every_epoch(tmp_path: Path, count: int) -> dict[int, list[dict[str, object]]]:
    """The recorded epochs, once each of 0..count-1 is there and consistent."""
    found = epochs(tmp_path)
    assert sorted(found) == list(range(count)), sorted(found)
    check_consistent(found)
    return found
