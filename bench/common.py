"""Shared helpers for dtlaunch's benchmarks: timing, medians, ratios, machine facts, test beds.

Every figure is measured side by side in one run: within each repetition the tools run one after
the other (round-robin, the starting tool rotating), so a load spike from another job on the
machine hits every tool alike. Results are medians of the repetitions plus ratios to a baseline;
the load average is sampled before and after each figure and printed with it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
SCRIPTS = BENCH / "scripts"
PYTHON = sys.executable

TINY_JOB = str(SCRIPTS / "tiny_job.py")  # a tiny Horovod job: init + one allreduce
CACHE_REFRESH_S = 200.0  # a warm pre-flight cache older than this is refilled (it lives 300 s)

sys.path.insert(0, str(ROOT / "tests"))  # the multi-host test bed lives with the tests
# Each MPI but the system's Open MPI 4 in a venv of its own (scripts/setup_mpis.sh), where the
# tests find them too.
from helpers.mpi_envs import MPI_VENVS as VENVS  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- running and timing -------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    returncode: int
    peak_rss_kib: int = 0  # VmHWM of the process started (not its children)
    cpu: float = 0.0  # user + system seconds of the process and the children it waited for
    stdout: str = ""
    stderr: str = ""
    hosts_cpu: float = 0.0  # where measured: the test bed's hosts' CPU seconds meanwhile


def _watch_hwm(pid: int, stop: threading.Event, box: list[int]) -> None:
    """Poll VmHWM (peak resident set) of one process until it exits."""
    path = f"/proc/{pid}/status"
    while not stop.is_set():
        try:
            with open(path) as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        box[0] = max(box[0], int(line.split()[1]))
                        break
        except OSError:
            return
        stop.wait(0.01)


CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, where mounted
UNIFIED = Path("/sys/fs/cgroup")  # cgroup v2: every group has cpu.stat, no controller needed


def _cgroup_root() -> tuple[Path, Callable[[Path], float]] | None:
    """Where a CPU-accounting group can be made, and how to read its user + system seconds."""
    if CPUACCT.is_dir():
        return CPUACCT, lambda folder: int((folder / "cpuacct.usage").read_text()) / 1e9
    if (UNIFIED / "cgroup.controllers").exists():
        def usage(folder: Path) -> float:
            stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return UNIFIED, usage
    return None


@contextlib.contextmanager
def cpu_group(pids: Sequence[int] = ()) -> Iterator[tuple[list[str], Callable[[], float]] | None]:
    """A fresh CPU-accounting cgroup: (argv prefix that moves a command into it, reader of its
    user + system seconds so far), or None where no cgroup (v1's cpuacct or v2) is writable. `pids`
    join it at once (with every child they start from then on: a test bed's sshd listeners).

    Unlike RUSAGE_CHILDREN it counts every process, whether or not its parent waited for it
    (mpirun does not always reap its ssh agents before it exits). Whatever is still in the
    group at the end is killed, then the group removed."""
    where = _cgroup_root()
    if where is None:
        yield None
        return
    folder = where[0] / f"dtlaunch-bench-{os.getpid()}-{time.monotonic_ns()}"
    try:
        folder.mkdir()
    except OSError:
        yield None
        return
    try:
        for pid in pids:
            (folder / "cgroup.procs").write_text(f"{pid}\n")
        prefix = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(folder)]
        yield prefix, lambda: where[1](folder)
    finally:
        for _ in range(50):
            left = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        with contextlib.suppress(OSError):
            folder.rmdir()


def timed(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 300,
          cwd: str | None = None, watch_rss: bool = False, check: bool = True,
          group_cpu: bool = False) -> Sample:
    """Run argv to completion; wall time from just before fork to just after exit.

    group_cpu: the CPU figure is the cgroup's (every process argv started, reaped or not),
    when cgroups allow; otherwise RUSAGE_CHILDREN's."""
    if group_cpu:
        with cpu_group() as group:
            if group is not None:
                prefix, read = group
                sample = timed([*prefix, *argv], env, timeout, cwd, watch_rss, check)
                sample.cpu = read()
                return sample
    stop = threading.Event()
    box = [0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    watcher = None
    if watch_rss:
        watcher = threading.Thread(target=_watch_hwm, args=(proc.pid, stop, box), daemon=True)
        watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        stop.set()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if watcher is not None:
        watcher.join(1)
    sample = Sample(seconds, proc.returncode, box[0], cpu, out, err)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)[:300]} exited {proc.returncode}:\n"
                           f"{out[-1500:]}\n{err[-2500:]}")
    return sample


@dataclass
class Series:
    """Repeated measurements of one tool in one setting."""

    name: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        return [s.seconds for s in self.samples]

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.samples else float("nan")

    @property
    def cpu_median(self) -> float:
        return statistics.median(s.cpu for s in self.samples) if self.samples else float("nan")

    @property
    def hosts_cpu_median(self) -> float:
        return statistics.median(s.hosts_cpu for s in self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.times), max(self.times)) if self.samples else (float("nan"),) * 2

    @property
    def peak_rss_mib(self) -> float:
        return max((s.peak_rss_kib for s in self.samples), default=0) / 1024


def round_robin(tools: Mapping[str, Callable[[], Sample]], reps: int, warmup: int = 1,
                label: str = "", warmup_only: Sequence[str] | None = None) -> dict[str, Series]:
    """Run every tool once per repetition, rotating the order; warm-up rounds (of every tool,
    or of `warmup_only`) are dropped."""
    names = list(tools)
    series = {name: Series(name) for name in names}
    for rep in range(-warmup, reps):
        shift = rep % len(names)
        order = names[shift:] + names[:shift]
        if rep < 0 and warmup_only is not None:
            order = [n for n in order if n in warmup_only]
        for name in order:
            sample = tools[name]()
            if rep >= 0:
                series[name].samples.append(sample)
        if rep >= 0:
            log(f"  {label} rep {rep + 1}/{reps}: " + ", ".join(
                f"{n} {series[n].samples[-1].seconds:.2f}s" for n in names))
    return series


def measured(tools: Mapping[str, Callable[[], Sample]], reps: int, label: str,
             **options: Any) -> dict[str, Any]:
    """round_robin (`options` are its own) with the load average around it:
    {"series": name -> Series, "load": "before → after"}."""
    before = loadavg()
    series = round_robin(tools, reps, warmup=1, label=label, **options)
    return {"series": series, "load": f"{before} → {loadavg()}"}


def sandwiched_ratios(sequence: Sequence[tuple[str, float]], key: str, base: str,
                      scale: float = 1.0) -> list[float]:
    """Each `key` measurement divided by `scale` x the mean of the nearest `base` measurements
    before and after it in time (one of them at the ends). On a machine whose speed drifts
    from minute to minute (a shared VM: ±10 %), pairing neighbours cancels the drift that a
    ratio of medians taken minutes apart keeps."""
    out = []
    for i, (name, value) in enumerate(sequence):
        if name != key:
            continue
        before = next((v for n, v in reversed(sequence[:i]) if n == base), None)
        after = next((v for n, v in sequence[i + 1:] if n == base), None)
        near = [v for v in (before, after) if v is not None]
        if near:
            out.append(value / (scale * statistics.fmean(near)))
    return out


def steady_rate(rates: Sequence[float], drop: int = 1) -> float:
    """The rate over equal-sized intervals after the first `drop` (warm-up: allocation, the
    first negotiation of every tensor): total work / total time, i.e. their harmonic mean."""
    kept = list(rates[drop:]) or list(rates)
    return len(kept) / sum(1.0 / r for r in kept)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def pyplot() -> Any | None:
    """matplotlib's pyplot drawing to files (Agg), or None (said once on stderr) when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no PNG")
        return None
    return plt


@contextlib.contextmanager
def figure(path: Path, *, dpi: int = 100, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """A matplotlib figure and its axes (`plt.subplots(**subplots)`), laid out, saved as
    `path` and closed at the end. Only where pyplot() is not None (publish checks)."""
    plt = pyplot()
    assert plt is not None, "matplotlib is not installed"
    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def hosts_axes(axes: Iterable[Any], counts: Sequence[int], xlabel: str = "hosts",
               log2: bool = False) -> None:
    """Axes against host counts: one tick per count (on a log2 scale with `log2`), y from 0,
    a light grid, the legend."""
    for ax in axes:
        ax.set_xlabel(xlabel)
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(counts)
        if log2:
            ax.set_xticklabels([str(n) for n in counts])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# --- machine facts ------------------------------------------------------------------------------


def _first_line(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr).strip() else "?"


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, str]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        mem = f"{kib / 1024 / 1024:.0f} GiB"
    return {
        "cores (nproc)": str(os.cpu_count()),
        "CPU": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "OS": _first_line(["sh", "-c", ". /etc/os-release && echo \"$PRETTY_NAME\""]),
        "Open MPI": _first_line(["mpirun", "--version"]),
        "OpenSSH": _first_line(["ssh", "-V"]),
        "Python": platform.python_version(),
        "torch": _dist_version("torch"),
        "horovod": _dist_version("horovod"),
        "paramiko": _dist_version("paramiko"),
    }


# --- environments for the three launchers -------------------------------------------------------


@functools.cache
def compile_tree(folder: Path) -> None:
    """Byte-compile a dtlaunch tree once per benchmark process, as `pip install` does: with
    PYTHONDONTWRITEBYTECODE set, every run would compile ~45 modules again (~0.1 s, not a cost
    an installed copy has)."""
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(folder)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)


def worktree_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for dtlaunch from this checkout (not an installed copy), its modules
    byte-compiled."""
    compile_tree(ROOT / "dtlaunch")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("DTLAUNCH_PREFLIGHT_CACHE", None)
    env.update(extra or {})
    return env


@contextlib.contextmanager
def baseline_tree(rev: str | None) -> Iterator[str | None]:
    """dtlaunch's package as of git revision `rev`, extracted to a temp dir (its PYTHONPATH), so
    a before/after comparison runs side by side in one run. None: no baseline."""
    if not rev:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="dtlaunch-bench-base-")
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "dtlaunch"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        compile_tree(Path(folder) / "dtlaunch")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def baseline_env(tree: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = worktree_env(extra)
    env["PYTHONPATH"] = tree + os.pathsep + env["PYTHONPATH"]
    return env


def mpi_venv(name: str) -> tuple[str, dict[str, str]] | None:
    """(python, environment) for one MPI: the system's Open MPI 4 with this interpreter, any
    other from its venv (its bin first on PATH), or None when that venv is not there."""
    env = worktree_env()
    if name == "openmpi4":
        return PYTHON, env
    folder = VENVS / name / "bin"
    if not (folder / "python").exists():
        return None
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    return str(folder / "python"), env


def dtlaunch_argv(*args: str) -> list[str]:
    """dtlaunch from PYTHONPATH's tree. -P: `python -m` would otherwise put the current
    directory first on sys.path, and from the repository root that is this checkout, which
    then shadows a baseline tree (`--baseline REV`) put on PYTHONPATH: both sides would run
    this checkout."""
    return [PYTHON, "-P", "-m", "dtlaunch", *args]


def warm_run(run: Callable[[], Sample], cache_home: str, *, fill: bool = False) -> tuple[Sample, bool]:
    """One timed run of a dtlaunch whose pre-flight cache (under `cache_home`, its
    XDG_CACHE_HOME) should be warm: a cache older than CACHE_REFRESH_S is dropped and filled
    again by an untimed run first, so that it cannot expire mid-sample; with `fill`, a missing
    one is filled too (else the first run, a warm-up, fills it). (the sample, whether it missed
    a cache that was there)."""
    folder = Path(cache_home) / "dtlaunch"
    stamps = [f.stat().st_mtime for f in folder.glob("preflight-*.json")]
    if (fill and not stamps) or (stamps and time.time() - max(stamps) > CACHE_REFRESH_S):
        for f in folder.glob("preflight-*.json"):
            f.unlink()
        run()
        stamps = [time.time()]
    sample = run()
    return sample, bool(stamps) and "(cached)" not in sample.stderr


def horovodrun_env(env: Mapping[str, str], wrap: Path) -> dict[str, str]:
    """`env` for horovodrun (or its SSH check): the ssh wrapper (ssh_wrapper) first on PATH."""
    return dict(env, PATH=f"{wrap}{os.pathsep}{env['PATH']}")


def horovodrun_path() -> str | None:
    candidate = Path(PYTHON).parent / "horovodrun"
    return str(candidate) if candidate.exists() else shutil.which("horovodrun")


@contextlib.contextmanager
def ssh_wrapper(config: Path) -> Iterator[Path]:
    """A directory with an `ssh` that adds `-F config`: put it first on PATH for tools (like
    horovodrun) that run a bare `ssh` and have no option for a config file. OpenSSH reads
    ~/.ssh/config from the password database's home, not $HOME, so a temp HOME would not do."""
    folder = Path(tempfile.mkdtemp(prefix="dtlaunch-bench-ssh-"))
    try:
        real = shutil.which("ssh") or "/usr/bin/ssh"
        wrapper = folder / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {real} -F "{config}" "$@"\n')
        wrapper.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def latency_config(bed: object, delay: float, path: Path) -> Path:
    """A copy of the bed's ssh config whose hosts are reached through a ProxyCommand that waits
    `delay` seconds before connecting: a slow link, since kernel netem is not available here."""
    base = Path(bed.ssh_config).read_text()  # type: ignore[attr-defined]
    nc = shutil.which("nc")
    if nc is not None:
        proxy = f"sh -c 'sleep {delay}; exec {nc} %h %p'"
    else:  # a small Python relay when netcat is not installed
        proxy = f"{PYTHON} {SCRIPTS / 'slow_relay.py'} {delay} %h %p"
    path.write_text(base.replace("Host *\n", f"Host *\n  ProxyCommand {proxy}\n", 1))
    return path


@contextlib.contextmanager
def bed_of(n: int, **options: object) -> Iterator[object]:
    """A test bed of n hosts, torn down on any exit, Ctrl-C and SIGTERM included."""
    from helpers.testbed import build_testbed

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    log(f"building a test bed of {n} hosts ...")
    started = time.monotonic()
    bed = build_testbed(n, **options)  # type: ignore[arg-type]
    log(f"  built in {time.monotonic() - started:.1f} s (subnet {bed.subnet})")
    try:
        yield bed
    finally:
        bed.close()
        signal.signal(signal.SIGTERM, previous)


def inside_h1(bed: Any) -> list[str]:
    """The argv prefix that runs a command inside host h1: its network, hostname and mount
    namespaces (the last for its /etc/hosts, which names every host of a bed built with
    names_resolve, as Horovod's Gloo and elastic modes need)."""
    assert bed.hosts[0].sshd is not None
    return ["nsenter", "-t", str(bed.hosts[0].sshd.pid), "-n", "-u", "-m", "--"]


@contextlib.contextmanager
def resolving_bed(n: int) -> Iterator[tuple[Any, Path, list[str]]]:
    """A bed of n hosts whose names resolve on every host (bed_of), the ssh wrapper for
    horovodrun and the prefix that runs a command inside h1: (bed, wrapper folder, prefix)."""
    with bed_of(n, names_resolve=True) as bed, ssh_wrapper(bed.ssh_config) as wrap:  # type: ignore[attr-defined]
        yield bed, wrap, inside_h1(bed)


def public(text: str) -> str:
    """`text` without this machine's paths: the checkout becomes relative, the interpreter
    running the benchmark `python` (results are read elsewhere, paths mean nothing there)."""
    return text.replace(PYTHON, "python").replace(str(ROOT) + "/", "").replace(str(ROOT), ".")


def bench_parser(doc: str | None, *, reps: int, out: str | None = None, hosts: str | None = None,
                 png: str | None = None, baseline: str | None = None,
                 reps_help: str | None = None) -> argparse.ArgumentParser:
    """The options a figure's script shares with the others: --reps, and where it takes them
    --hosts (comma-separated counts), --baseline REV (`baseline` is its help), --out and --png
    (file names in results/); the script adds its own."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--reps", type=int, default=reps, help=reps_help)
    if hosts is not None:
        parser.add_argument("--hosts", default=hosts)
    if baseline is not None:
        parser.add_argument("--baseline", metavar="REV", help=baseline or None)
    if out is not None:
        parser.add_argument("--out", default=out)
    if png is not None:
        parser.add_argument("--png", default=png)
    return parser


def host_counts(text: str) -> list[int]:
    """`--hosts 8,32,64` as numbers."""
    return [int(n) for n in text.split(",") if n]


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """How a figure was made, for its results file: `python bench/SCRIPT ARGS`."""
    return f"python bench/{script} {shlex.join(sys.argv[1:] if argv is None else argv)}".strip()


def run_header(command: str, machine_tail: str) -> list[str]:
    """A results file's first lines: the command, the date and the machine, then
    `machine_tail` (say, the load average)."""
    info = machine_info()
    return [f"Command (as root, from the repository root): `{command}`  ",
            f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: "
            f"{info['cores (nproc)']} cores ({info['CPU']}), {info['memory']}, shared with "
            f"other work{machine_tail}"]


def publish(out: str, raw: object, report: Callable[[str | None], str], png: str | None = None,
            plot: Callable[[Path], None] | None = None) -> str:
    """A figure's files: every sample as results/raw/OUT.json (OUT without .md), the PNG
    results/PNG that `plot` draws where one is asked for and matplotlib is installed, then the
    markdown `report` writes, given the PNG's name or None, as results/OUT; that markdown."""
    save_raw(out.removesuffix(".md"), raw)
    RESULTS.mkdir(exist_ok=True)
    drawn = png if png and plot is not None and pyplot() is not None else None
    if drawn and plot is not None:
        plot(RESULTS / drawn)
    return write_result(out, report(drawn))


def write_result(name: str, text: str) -> str:
    """Write one figure's markdown table to results/NAME, show it, and return it."""
    RESULTS.mkdir(exist_ok=True)
    text = public(text)
    (RESULTS / name).write_text(text)
    log(text)
    return text


def save_raw(name: str, data: object) -> None:
    """Every sample, as JSON, next to the tables (results/raw/NAME.json)."""
    import json

    def plain(obj: object) -> object:
        if isinstance(obj, Series):
            return {"times": obj.times, "cpu": [s.cpu for s in obj.samples],
                    "hosts_cpu": [s.hosts_cpu for s in obj.samples],
                    "peak_rss_kib": [s.peak_rss_kib for s in obj.samples]}
        if isinstance(obj, dict):
            return {str(k): plain(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [plain(v) for v in obj]
        return obj

    folder = RESULTS / "raw"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(plain(data), indent=1))


# --- markdown -----------------------------------------------------------------------------------


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_s(series: Series) -> str:
    lo, hi = series.spread
    return f"{series.median:.2f} ({lo:.2f}–{hi:.2f})"
