"""Show doctor and env-check results (a rich table with one fix per failure, or JSON), a
job's end (root cause first, as lines or JSON; a pre-flight's refusal), a --max-restarts job's
attempts (lines, and attempts.json) and the live progress line while things start.

The only module that imports rich (lazily, inside the functions that draw).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict
from typing import IO, TYPE_CHECKING, Any

from dtlaunch.core.failure import signal_name
from dtlaunch.run.events import HOSTS_CHECKED, HOSTS_UP, RANKS_RUNNING, Progress

if TYPE_CHECKING:  # the checks' model is imported by what draws it, not by a job's run
    from dtlaunch.check.facts import GpuFacts
    from dtlaunch.check.report import CheckResult, DoctorReport, Status
    from dtlaunch.doctor.envcheck import EnvReport
    from dtlaunch.doctor.preflight import PreflightFailure
    from dtlaunch.run.failure_report import JobReport, RootCause
    from dtlaunch.run.restarts import AttemptRecord, RestartReport

# By a Status's word (a Status is that str: check.report).
SYMBOLS = {"pass": "pass", "warn": "warn", "fail": "FAIL", "skip": "-"}
STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
STAGES = (HOSTS_CHECKED, HOSTS_UP, RANKS_RUNNING)  # the progress line's, in its order


def _console(stream: IO[str] | None) -> Any:
    """Wide enough for the table when the output is a file or a pipe."""
    from rich.console import Console

    out = stream or sys.stdout
    return Console(file=out, highlight=False, width=None if out.isatty() else 200)


def report_to_dict(report: DoctorReport) -> dict[str, Any]:
    from dtlaunch.check.report import CHECK_NAMES, LOCAL, PASS, SKIP

    # The JSON's word for this machine's row stays "launcher", as scripts that read doctor's
    # --json know it (docs/doctor.md); every other place calls it "this machine".
    json_roles = {LOCAL: "launcher"}
    return {
        "status": report.status if report.status != SKIP else PASS,
        "ok": report.ok,
        "seconds": round(report.seconds, 3),
        "checks": list(CHECK_NAMES),
        "reach": report.reach,
        "job": [{"name": c.name, "status": c.status, "detail": c.detail, "hint": c.hint}
                for c in report.job],
        "hosts": [
            {
                "host": h.host,
                "role": json_roles.get(h.role, h.role.value),
                "hostname": h.hostname,
                "status": h.status,
                "seconds": round(h.seconds, 3),
                "versions": dict(h.versions),
                "note": h.note,
                "warnings": list(h.warnings),
                "checks": [asdict(c) for c in h.checks],
                "gpus": gpus_to_dict(h.gpus, dict(h.versions).get("nccl")),
            }
            for h in report.hosts
        ],
    }


def gpus_to_dict(gpus: GpuFacts | None, nccl: str | None) -> dict[str, Any] | None:
    """A host's NVIDIA GPUs for JSON; None where there is no nvidia-smi (or no answer)."""
    if gpus is None or not gpus.smi:
        return None
    return {"count": gpus.count, "driver": gpus.driver, "cuda": gpus.cuda, "nccl": nccl,
            "error": gpus.error or None, "note": gpus.note or None,
            "devices": [asdict(g) for g in gpus.gpus]}


def report_to_json(report: DoctorReport) -> str:
    return json.dumps(report_to_dict(report), indent=2)


def preload() -> None:
    """Import rich (~60 ms) ahead of time, e.g. while the doctor waits for hosts."""
    import rich.console
    import rich.markup
    import rich.table  # noqa: F401


def render_report(report: DoctorReport, stream: IO[str] | None = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from dtlaunch.check.report import CHECK_NAMES, FAIL, LOCAL, SKIP, WARN

    console = _console(stream)
    table = Table(title=None, show_lines=False, pad_edge=False)
    table.add_column("host", no_wrap=True)
    for name in CHECK_NAMES:
        table.add_column(report.label(name), justify="center")
    table.add_column("time", justify="right")
    for host in report.hosts:
        label = host.host + (f" ({LOCAL})" if host.role == LOCAL else "")
        cells = [_cell(check.status if check else SKIP)
                 for check in map(host.check, CHECK_NAMES)]
        table.add_row(escape(label), *cells, f"{host.seconds:.2f}s")
    console.print(table)
    for host in report.hosts:
        versions = ", ".join(f"{k} {v}" for k, v in host.versions if k != "mpi")
        if versions:
            console.print(f"[dim]{escape(host.host)}: {escape(versions)}[/]")
        if host.note:
            console.print(f"[yellow]{escape(host.host)}: {escape(host.note)}[/]")
        for warning in host.warnings:
            console.print(f"[yellow]{escape(host.host)}: warning: {escape(warning)}[/]")
    for check in report.job:
        if check.status not in (FAIL, WARN):
            console.print(f"[dim]{check.name}: {escape(check.detail)}[/]")
    for host_name, check in (*report.failures(), *report.failures(WARN)):
        _print_problem(console, f"[bold]{escape(host_name)}[/]", check)
    total = len(report.hosts)
    bad = len({h for h, _ in report.failures()})
    summary = (f"all {total} host(s) ready" if report.ok
               else f"{bad} of {total} host(s) have problems")
    console.print(f"{summary} ({report.seconds:.2f} s)")


class ProgressLine:
    """One live line on stderr while a job (or doctor) starts: each stage with its count,
    `hosts checked 3/4, hosts up 1/3, ranks running 2/6`. Only on a terminal: disabled, it
    draws nothing at all. It goes when the start is over (a final Progress), and steps aside
    (`pause`) for a message; the next count draws it again."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.counts: dict[str, tuple[int, int]] = {}
        self.live: Any = None
        self.over = False
        self.spinner = "dots"
        # The job's output threads count ranks while the main thread prints messages.
        self.lock = threading.RLock()

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def text(self) -> str:
        return ", ".join(f"{stage} {self.counts[stage][0]}/{self.counts[stage][1]}"
                         for stage in STAGES if stage in self.counts)

    def update(self, progress: Progress) -> None:
        with self.lock:
            if progress.stage == RANKS_RUNNING and progress.done == 0 and not progress.final:
                self.over = False  # a (new) launch begins: a restart's attempt draws it anew
                self.counts.pop(HOSTS_UP, None)
            if not self.enabled or self.over:
                return
            self.counts[progress.stage] = (progress.done, progress.total)
            if progress.final:
                self.over = True
                self.pause()
                return
            from rich.spinner import Spinner

            if self.live is None:
                from rich.console import Console
                from rich.live import Live

                console = Console(stderr=True)
                if not console.is_terminal or console.is_dumb_terminal:  # TERM=dumb: no redraws
                    self.enabled = False
                    return
                # Braille dots where the terminal takes UTF-8, an ASCII spinner elsewhere (LANG=C).
                self.spinner = "dots" if console.encoding.lower().startswith("utf") else "line"
                self.live = Live(Spinner(self.spinner, self.text()), console=console,
                                 transient=True, redirect_stdout=False, redirect_stderr=False,
                                 refresh_per_second=8)
                self.live.start(refresh=True)
            else:
                self.live.update(Spinner(self.spinner, self.text()))

    def hosts_checked(self, done: int, total: int, _host: str) -> None:
        """doctor's progress callback."""
        self.update(Progress(HOSTS_CHECKED, done, total))

    def pause(self) -> None:
        """Take the line off the screen (a message follows, or the start is over)."""
        with self.lock:
            if self.live is not None:
                live, self.live = self.live, None
                live.stop()

    def close(self) -> None:
        with self.lock:
            self.over = True
            self.pause()


# --- a job's end ----------------------------------------------------------------------------


def clock_time(at: float, ms: bool = False) -> str:
    """Local wall-clock time of day, to the second (`ms`: the millisecond): enough to match the
    job's own logs."""
    text = time.strftime("%H:%M:%S", time.localtime(at))
    return text + f".{int(at % 1 * 1000):03d}" if ms else text


def job_report_lines(report: JobReport) -> list[str]:
    """The end of a job, for stderr (each line is given the `dtlaunch: ` prefix by the CLI,
    the rank's last lines excepted): the root cause first, with the rank's last lines; then
    the other failures, one line per cause; then the one-line summary scripts read, last."""
    if report.quiet:
        return []
    lines = list(report.notes)
    root = report.root
    if root is None:
        return lines
    if root.last_lines or report.others:
        when = f" at {clock_time(root.at, ms=True)}" if root.at is not None else ""
        lines.append(f"root cause (first failure): {root.failure.describe()}{when}")
        if root.last_lines:
            cause = root.failure
            tag = f"[{cause.rank}@{cause.host}] " if cause.rank is not None else ""
            lines.append(f"  its last {len(root.last_lines)} line(s):")
            lines += ["    " + tag + line for line in root.last_lines]
        lines += [f"then: {group.line()}" for group in report.others]
    summary = report.summary()
    if summary is not None:
        lines.append(summary)
    return lines


def job_report_to_dict(report: JobReport | None, exit_code: int,
                       refused: PreflightFailure | None = None) -> dict[str, Any]:
    """`dtlaunch run --json`'s document: the same report as data. ``refused``: the pre-flight
    stopped the run (report None)."""
    error = refused.describe() if refused is not None else None
    if report is None:
        return {"version": JOB_REPORT_VERSION, "status": "not-started", "exit_code": exit_code,
                "error": error, "ranks": 0, "notes": [], "root_cause": None,
                "other_failures": [], "summary": error}
    root = report.root
    return {
        "version": JOB_REPORT_VERSION,
        "status": report.status,
        "exit_code": report.exit_code,
        "error": error,
        "ranks": report.ranks,
        "notes": list(report.notes),
        "root_cause": None if root is None else _root_cause_to_dict(root),
        "other_failures": [
            {"cause": g.cause, "ranks": list(g.ranks), "ranks_text": g.ranks_text,
             "hosts": list(g.hosts), "hosts_text": g.hosts_text, "exit_code": g.exit_code,
             "signal": g.signal,
             "signal_name": signal_name(g.signal) if g.signal is not None else None}
            for g in report.others],
        "summary": report.summary(),
    }


def _root_cause_to_dict(root: RootCause) -> dict[str, Any]:
    cause = root.failure
    return {
        "description": cause.describe(),
        "rank": cause.rank,
        "host": cause.host,
        "exit_code": cause.exit_code,
        "signal": cause.signal,
        "signal_name": signal_name(cause.signal) if cause.signal is not None else None,
        "reason": cause.reason or None,
        "at": root.at,
        "last_lines": list(root.last_lines),
    }


JOB_REPORT_VERSION = 1


# --- a --max-restarts job's end ---------------------------------------------------------------

ATTEMPTS_FILE = "attempts.json"  # written to --output-dir
ATTEMPTS_REPORT_VERSION = 1


def iso_utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


def restart_report_lines(report: RestartReport) -> list[str]:
    """One line per attempt, the hosts dropped and why, and why the loop stopped (each line is
    given the `dtlaunch: ` prefix by the CLI)."""
    used = max(len(report.attempts) - 1, 0)
    lines = [f"attempts ({used} of {report.max_restarts} restart(s) used):"]
    lines += [f"  #{r.number} {clock_time(r.started_at)} {r.duration_s:7.1f} s  "
              f"{r.ranks} rank(s) on {','.join(r.hosts)}: {r.ended} (exit {r.exit_code})"
              for r in report.attempts]
    for record in report.attempts:
        for host, why in record.dropped:
            lines.append(f"dropped {host} before attempt #{record.number}: {why}")
    lines.append(f"stopped: {report.stop.reason} (exit {report.exit_code})")
    return lines


def attempt_to_dict(record: AttemptRecord) -> dict[str, Any]:
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


def restart_report_json(report: RestartReport) -> str:
    """The document written to ``--output-dir/attempts.json``; times are seconds since the
    epoch (``*_at``) so they line up with timestamps the job itself logs."""
    return json.dumps({
        "version": ATTEMPTS_REPORT_VERSION,
        "max_restarts": report.max_restarts,
        "exit_code": report.exit_code,
        "stop": {"kind": report.stop.kind, "reason": report.stop.reason},
        "attempts": [attempt_to_dict(r) for r in report.attempts],
    }, indent=2) + "\n"


# --- env-check ------------------------------------------------------------------------------


def env_to_json(report: EnvReport) -> str:
    return json.dumps({"ok": report.ok, **report.facts, "items": [i.to_dict() for i in report.items]},
                      indent=2, default=str)


def render_env(report: EnvReport, stream: IO[str] | None = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from dtlaunch.check.report import FAIL, WARN

    console = _console(stream)
    table = Table(pad_edge=False)
    for column in ("section", "item", "value", "status"):
        table.add_column(column)
    items = report.items
    for item in items:
        check = item.check
        table.add_row(escape(item.section), escape(check.name), escape(check.detail),
                      _cell(check.status))
    console.print(table)
    for item in items:
        if item.check.status in (FAIL, WARN) and item.check.hint:
            _print_problem(console, escape(item.section), item.check)


def _cell(status: Status) -> str:
    return f"[{STYLES[status]}]{SYMBOLS[status]}[/]"


def _print_problem(console: Any, where: str, check: CheckResult) -> None:
    """A failure or warning (`where`: its host or section, as markup) with its fix."""
    from rich.markup import escape

    from dtlaunch.check.report import FAIL

    word = "[bold red]FAIL[/]" if check.status == FAIL else "[yellow]warn[/]"
    console.print(f"{word} {where} {escape(check.name)}: {escape(check.detail)}")
    if check.hint:
        console.print(f"     [cyan]fix:[/] {escape(check.hint)}")
