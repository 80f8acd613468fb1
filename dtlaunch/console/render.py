"""Show doctor and env-check results: a rich table with one fix per failure, or JSON.

The only module that imports rich (lazily, inside the functions that draw).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import IO, TYPE_CHECKING, Any

from dtlaunch.check.report import FAIL, PASS, SKIP, WARN, DoctorReport

if TYPE_CHECKING:
    from dtlaunch.check.gpu_facts import GpuFacts
    from dtlaunch.doctor.envcheck import EnvReport

SYMBOLS = {PASS: "pass", WARN: "warn", FAIL: "FAIL", SKIP: "-"}
STYLES = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def _console(console_class: Any, stream: IO[str] | None) -> Any:
    """Wide enough for the table when the output is a file or a pipe."""
    import sys

    out = stream or sys.stdout
    wide = None if out.isatty() else 200
    return console_class(file=out, highlight=False, width=wide)


def report_to_dict(report: DoctorReport) -> dict[str, Any]:
    return {
        "status": report.status if report.status != SKIP else PASS,
        "ok": report.ok,
        "seconds": round(report.seconds, 3),
        "checks": list(report.columns),
        "reach": report.reach,
        "job": [{"name": c.name, "status": c.status, "detail": c.detail, "hint": c.hint}
                for c in report.job],
        "hosts": [
            {
                "host": h.host,
                "role": h.role,
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


def fix_lines(report: DoctorReport) -> list[str]:
    """One line per failure (and warning): host, check, what is wrong, how to fix it."""
    lines = []
    for host, check in (*report.failures(), *report.warnings()):
        word = "FAIL" if check.status == FAIL else "warn"
        lines.append(f"{word} {host} {check.name}: {check.detail}"
                     + (f"\n     fix: {check.hint}" if check.hint else ""))
    return lines


def preload() -> None:
    """Import rich (~60 ms) ahead of time, e.g. while the doctor waits for hosts."""
    import rich.console
    import rich.markup
    import rich.table  # noqa: F401


def render_report(report: DoctorReport, stream: IO[str] | None = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = _console(Console, stream)
    table = Table(title=None, show_lines=False, pad_edge=False)
    table.add_column("host", no_wrap=True)
    for name in report.columns:
        table.add_column(report.reach if name == "reach" else name, justify="center")
    table.add_column("time", justify="right")
    for host in report.hosts:
        label = host.host + (" (launcher)" if host.role == "launcher" else "")
        cells = []
        for name in report.columns:
            check = host.check(name)
            status = check.status if check else SKIP
            cells.append(f"[{STYLES[status]}]{SYMBOLS[status]}[/]")
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
    for host_name, check in (*report.failures(), *report.warnings()):
        word = "[bold red]FAIL[/]" if check.status == FAIL else "[yellow]warn[/]"
        console.print(f"{word} [bold]{escape(host_name)}[/] {check.name}: {escape(check.detail)}")
        if check.hint:
            console.print(f"     [cyan]fix:[/] {escape(check.hint)}")
    total = len(report.hosts)
    bad = len({h for h, _ in report.failures()})
    summary = (f"all {total} host(s) ready" if report.ok
               else f"{bad} of {total} host(s) have problems")
    console.print(f"{summary} ({report.seconds:.2f} s)")


class Spinner:
    """A progress line on stderr while hosts answer (only on a terminal)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.status: Any = None
        if enabled:
            from rich.console import Console

            self.status = Console(stderr=True).status(f"checking {total} host(s)...")

    def __enter__(self) -> Spinner:
        if self.status is not None:
            self.status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def update(self, done: int, total: int, host: str) -> None:
        if self.status is not None:
            self.status.update(f"checked {done} of {total} host(s); last: {host}")


# --- env-check ------------------------------------------------------------------------------


def env_to_dict(report: EnvReport) -> dict[str, Any]:
    return {"ok": report.ok, **report.facts, "items": [i.to_dict() for i in report.items]}


def env_to_json(report: EnvReport) -> str:
    return json.dumps(env_to_dict(report), indent=2, default=str)


def render_env(report: EnvReport, stream: IO[str] | None = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = _console(Console, stream)
    table = Table(pad_edge=False)
    for column in ("section", "item", "value", "status"):
        table.add_column(column)
    items = report.items
    for item in items:
        check = item.check
        table.add_row(escape(item.section), escape(check.name), escape(check.detail),
                      f"[{STYLES[check.status]}]{SYMBOLS[check.status]}[/]")
    console.print(table)
    for item in items:
        check = item.check
        if check.status in (FAIL, WARN) and check.hint:
            word = "[bold red]FAIL[/]" if check.status == FAIL else "[yellow]warn[/]"
            console.print(f"{word} {escape(item.section)} {escape(check.name)}: "
                          f"{escape(check.detail)}")
            console.print(f"     [cyan]fix:[/] {escape(check.hint)}")
