"""A real Slurm cluster on the test bed: munged, slurmctld and one slurmd per bed host.

Everything is private to one bed: munged gets its own key and socket, slurm.conf and
cgroup.conf live in the bed's directory (clients get SLURM_CONF, daemons -f), the cluster name
carries the bed's random tag and slurmctld listens on a free port, so concurrent runs never
clash and the machine's /etc/slurm and /run/munge are never touched. slurmctld runs in the root
namespace (the launcher, like a login node); each slurmd runs inside its host's network and UTS
namespaces and a private mount namespace with its own tmpfs /tmp, as a real node has (Slurm's
PMIx plugin fails every step on a /tmp shared between nodes). What jobs need is bound back
into that /tmp wherever it lives (`job_paths`: the checkout, the venvs, HOME), so the suite
runs from a checkout under /tmp too (tests/testbed/test_slurm_paths_testbed.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dtlaunch.core.bounded import run_bounded_apart
from helpers.testbed import TestBed

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "slurmstepd", "srun", "salloc", "sbatch", "sinfo",
               "scancel", "squeue")
SBIN = ("/usr/sbin", "/sbin")


def _which(tool: str) -> str | None:
    return shutil.which(tool) or next(
        (f"{d}/{tool}" for d in SBIN if os.access(f"{d}/{tool}", os.X_OK)), None)


def missing_slurm() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    missing = [t for t in SLURM_TOOLS if _which(t) is None]
    if missing:
        return ("missing Slurm/munge tools: " + ", ".join(missing)
                + " (apt-get install slurmctld slurmd slurm-client munge)")
    return None


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _stop(proc: subprocess.Popen[bytes] | None, grace: float = 10) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@dataclass
class SlurmCluster:
    bed: TestBed
    dir: Path
    name: str
    ctld_port: int
    slurmd_port: int
    cpus: int
    munged: subprocess.Popen[bytes] | None = None
    slurmctld: subprocess.Popen[bytes] | None = None
    slurmds: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    shared: tuple[Path, ...] = ()
    _stopped: bool = field(default=False, repr=False)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge.sock"

    @property
    def nodes(self) -> list[str]:
        return self.bed.names

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for Slurm clients: the caller's (or this process's) plus SLURM_CONF.

        SLURM_* variables of any enclosing job are dropped so a test never leaks into another.
        """
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, timeout: float = 120, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (srun, salloc, sinfo, ...) from the launcher.

        It gets a session of its own (dtlaunch.core.bounded): on a timeout the whole group
        (salloc and the srun or mpirun under it) is killed before TimeoutExpired is raised, so
        nothing is left behind.
        """
        code, out, err = run_bounded_apart(argv, timeout, env=self.env(env),
                                           cwd=None if cwd is None else str(cwd))
        return subprocess.CompletedProcess(list(argv), code, out.decode(errors="replace"),
                                           err.decode(errors="replace"))

    def log(self, name: str) -> str:
        path = self.dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def job_state(self, job: str) -> str:
        """The job's JobState as scontrol shows it now ("" when it is unknown)."""
        show = self.run("scontrol", "show", "job", "-o", job, timeout=30).stdout
        return next((w.split("=", 1)[1] for w in show.split() if w.startswith("JobState=")), "")

    def wait_job_ended(self, job: str, within: float = 180) -> str:
        """Wait until the job has left its pending and running states; its final state."""
        deadline = time.monotonic() + within
        while (state := self.job_state(job)) in ("PENDING", "RUNNING", "CONFIGURING",
                                                 "COMPLETING", ""):
            assert time.monotonic() < deadline, f"Slurm job {job} still {state or 'unknown'}"
            time.sleep(0.5)
        return state

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=30).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, proc in [("slurmctld", self.slurmctld), *self.slurmds.items()]:
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}): "
                                       + self._tail(name))
            with contextlib.suppress(subprocess.TimeoutExpired):
                states = self.node_states()
                if sorted(states) == sorted(self.nodes) and all(
                        s.rstrip("*") == "idle" for s in states.values()):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm nodes not idle within {timeout} s: {states}; "
                           + self._tail("slurmctld"))

    def _tail(self, name: str) -> str:
        names = ["slurmctld.log"] if name == "slurmctld" else [f"slurmd-{name}.out",
                                                               f"slurmd-{name}.log"]
        lines = [ln for n in names for ln in self.log(n).strip().splitlines()]
        return " | ".join(lines[-6:])

    def stop(self) -> None:
        """Stop every daemon and whatever Slurm started on the nodes; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for proc in self.slurmds.values():
            _stop(proc)
        # slurmstepd and job processes outlive slurmd; end everything the nodes still run.
        for h in self.bed.hosts:
            for pid in self.bed.stray_pids(h):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _stop(self.slurmctld)
        _stop(self.munged)
        shutil.rmtree(self.dir, ignore_errors=True)


def _slurm_conf(c: SlurmCluster) -> str:
    d = c.dir
    addrs = ",".join(h.address for h in c.bed.hosts)
    return "\n".join([
        f"ClusterName={c.name}",
        f"SlurmctldHost={socket.gethostname()}({c.bed.gateway})",
        f"SlurmctldPort={c.ctld_port}",
        f"SlurmdPort={c.slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={c.munge_socket}",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/slurmctld.log",
        f"SlurmdLogFile={d}/slurmd-%n.log",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/linear",
        "ReturnToService=2",
        "MpiDefault=none",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=300",  # keep finished jobs visible to scontrol (no accounting here)
        "MessageTimeout=20",
        "SlurmdTimeout=120",
        f"NodeName={','.join(c.nodes)} NodeAddr={addrs} CPUs={c.cpus} State=UNKNOWN",
        "PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


CGROUP_CONF = "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n"


def job_paths(environ: Mapping[str, str] | None = None) -> list[Path]:
    """What a job on the nodes needs to see wherever it lives, under /tmp too: the checkout
    (a job's steps start in the submitting directory), the interpreter's venv and its base,
    the MPI venvs, and HOME (its cache holds them and dtlaunch's own files)."""
    env = os.environ if environ is None else environ
    repo = Path(__file__).resolve().parent.parent
    paths = [repo, Path(sys.prefix), Path(sys.base_prefix), Path.home()]
    for name in ("HOME", "XDG_CACHE_HOME", "DTLAUNCH_MPI_VENVS", "VIRTUAL_ENV"):
        if env.get(name):
            paths.append(Path(env[name]))
    return paths


def start_slurm_cluster(bed: TestBed, shared: Sequence[Path] = (),
                        timeout: float = 120) -> SlurmCluster:
    """Start munged, slurmctld and one slurmd per bed host; wait until every node is idle.

    shared: directories (besides the bed's own and what jobs need, `job_paths`) that every
    node must see despite its private /tmp, e.g. pytest's base temp directory. The caller
    must stop() the cluster.
    """
    tag = secrets.token_hex(3)
    ctld_port, slurmd_port = _free_ports(2)
    c = SlurmCluster(bed=bed, dir=bed.workdir / f"slurm-{tag}", name=f"dtl{tag}",
                     ctld_port=ctld_port, slurmd_port=slurmd_port, cpus=os.cpu_count() or 1,
                     shared=tuple(shared))
    atexit.register(c.stop)
    try:
        for sub in ("state", "spool"):
            (c.dir / sub).mkdir(parents=True)
        os.chmod(c.dir, 0o755)  # munged wants the socket's directory searchable by everyone
        key = c.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        key.chmod(0o600)
        c.conf.write_text(_slurm_conf(c))
        (c.dir / "cgroup.conf").write_text(CGROUP_CONF)
        c.munged = subprocess.Popen(
            [_which("munged") or "munged", "--force", "--foreground",
             f"--socket={c.munge_socket}", f"--key-file={key}", f"--log-file={c.dir}/munged.log",
             f"--pid-file={c.dir}/munged.pid", f"--seed-file={c.dir}/munged.seed"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        _wait_for(lambda: c.munge_socket.exists(), 15, "munged did not create its socket")
        c.slurmctld = subprocess.Popen(
            [_which("slurmctld") or "slurmctld", "-D", "-c", "-i", "-f", str(c.conf)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=c.env())
        keep = [bed.workdir, *shared, *job_paths()]
        for h in bed.hosts:
            c.slurmds[h.name] = bed.spawn_in(
                h, [_which("slurmd") or "slurmd", "-D", "-N", h.name, "-f", str(c.conf)],
                private_tmp=True, keep=keep, log=c.dir / f"slurmd-{h.name}.out")
        c.wait_idle(timeout)
    except BaseException:
        c.stop()
        raise
    return c


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise RuntimeError(what)


@contextlib.contextmanager
def slurm_cluster(bed: TestBed, shared: Sequence[Path] = ()) -> Iterator[SlurmCluster]:
    cluster = start_slurm_cluster(bed, shared)
    try:
        yield cluster
    finally:
        cluster.stop()
