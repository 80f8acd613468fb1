"""The end report of `dtlaunch run --max-restarts`: lines for the terminal, JSON for
``--output-dir/attempts.json``. Pure: the caller prints the lines and writes the file."""

from __future__ import annotations

import json
import time
from typing import Any

from dtlaunch.run.restarts import AttemptRecord, RestartReport

ATTEMPTS_FILE = "attempts.json"
REPORT_VERSION = 1


def clock_time(at: float) -> str:
    """Local wall-clock time of day, to the second: enough to match the job's own logs."""
    return time.strftime("%H:%M:%S", time.localtime(at))


def iso_utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


def attempt_line(record: AttemptRecord) -> str:
    hosts = ",".join(record.hosts)
    return (f"  #{record.number} {clock_time(record.started_at)} {record.duration_s:7.1f} s  "
            f"{record.ranks} rank(s) on {hosts}: {record.ended} (exit {record.exit_code})")


def build_report_lines(report: RestartReport) -> list[str]:
    """One line per attempt, the hosts dropped and why, and why the loop stopped."""
    used = max(len(report.attempts) - 1, 0)
    lines = [f"attempts ({used} of {report.max_restarts} restart(s) used):"]
    lines += [attempt_line(record) for record in report.attempts]
    for record in report.attempts:
        for host, why in record.dropped:
            lines.append(f"dropped {host} before attempt #{record.number}: {why}")
    lines.append(f"stopped: {report.stop.reason} (exit {report.exit_code})")
    return lines


def attempt_json(record: AttemptRecord) -> dict[str, Any]:
    return {
        "number": record.number,
        "started_at": record.started_at,
        "started": iso_utc(record.started_at),
        "ended_at": record.started_at + record.duration_s,
        "duration_s": record.duration_s,
        "hosts": list(record.hosts),
        "ranks": record.ranks,
        "ended": record.ended,
        "exit_code": record.exit_code,
        "dropped_before": [{"host": h, "why": why} for h, why in record.dropped],
        "recheck_s": record.recheck_s,
        "waited_s": record.waited_s,
    }


def build_report_json(report: RestartReport) -> str:
    """The document written to ``--output-dir/attempts.json``; times are seconds since the
    epoch (``*_at``) so they line up with timestamps the job itself logs."""
    return json.dumps({
        "version": REPORT_VERSION,
        "max_restarts": report.max_restarts,
        "exit_code": report.exit_code,
        "stop": {"kind": report.stop.kind, "reason": report.stop.reason},
        "attempts": [attempt_json(r) for r in report.attempts],
    }, indent=2) + "\n"
