"""A real multi-host test bed on one Linux machine.

Each host is a network namespace on a private bridge with its own UTS hostname, its own sshd
(own host key, own authorized_keys) listening on its own address. Clients get a dedicated key,
known_hosts and ssh_config in a private temp dir; the user's ~/.ssh is never read or written.
Everything is named with a random tag so concurrent runs never clash, and torn down on exit.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "ssh", "ssh-keygen", "mpirun")
# Hosts set up (or torn down) at once; the work is mostly waiting on `ip` and ssh-keygen.
BUILD_WORKERS = 8
# Host i gets the subnet's address 10 + i: a /24 holds this many.
MAX_HOSTS = 244


def missing_requirements() -> str | None:
    """Why a test bed cannot be built here, or None."""
    if os.geteuid() != 0:
        return "the test bed needs root (network namespaces)"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if not os.path.exists(SSHD):
        missing.append("sshd")
    if missing:
        return "missing tools for the test bed: " + ", ".join(missing)
    return None


def _run(*argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout)


def _pick_subnet() -> ipaddress.IPv4Network:
    """A random /24 under 10.0.0.0/8 that no route on this machine already covers."""
    routes = _run("ip", "-4", "route", "show", "table", "all", check=False).stdout
    used = []
    for line in routes.splitlines():
        first = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(first if "/" in first else f"{first}/32", strict=False))
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(64, 250)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test bed")


def under_tmp(paths: Sequence[Path | str]) -> list[str]:
    """The paths that lie under /tmp, relative to it, without those inside another one (its
    bind brings them along); existing directories only, links resolved."""
    tmp = os.path.realpath("/tmp")
    found: list[str] = []
    for path in sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)}):
        rel = os.path.relpath(path, tmp)
        if rel == "." or rel.startswith(".."):
            continue  # /tmp itself would hide nothing; outside it nothing is hidden
        if not any(rel == f or rel.startswith(f + os.sep) for f in found):
            found.append(rel)
    return found


@dataclass
class BedHost:
    name: str
    netns: str
    address: str
    dir: Path
    sshd_extra: tuple[str, ...] = ()
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def authorized_keys(self) -> Path:
        return self.dir / "authorized_keys"


@dataclass
class TestBed:
    hosts: list[BedHost]
    subnet: str
    gateway: str
    bridge: str
    workdir: Path
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    names_resolve: bool = False  # each host resolves every bed host's name (its own too)
    # sshd's limit on connections not yet logged in (its default is 10:30:100): the bed's is
    # high so that tests never meet it; a benchmark may ask for the default.
    max_startups: str = "200"
    _closed: bool = field(default=False, repr=False)
    __test__ = False  # not a pytest test class

    def host(self, name: str) -> BedHost:
        return next(h for h in self.hosts if h.name == name)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    # --- acting inside hosts ------------------------------------------------------------------

    def nsenter_argv(self, host: BedHost | str, argv: Sequence[str],
                     mounts: bool = False) -> list[str]:
        """argv that runs inside the host's network and UTS namespaces; `mounts`: its sshd's
        mount namespace too (where, on a bed whose names resolve, /etc/hosts names them)."""
        h = self.host(host) if isinstance(host, str) else host
        assert h.sshd is not None, f"{h.name}: sshd is not running"
        return ["nsenter", "-t", str(h.sshd.pid), "-n", "-u", *(["-m"] if mounts else []), "--",
                *argv]

    def exec_in(self, host: BedHost | str, argv: Sequence[str], timeout: float = 60,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.nsenter_argv(host, argv), capture_output=True, text=True,
                              timeout=timeout, env=dict(env) if env is not None else None)

    def spawn_in(self, host: BedHost | str, argv: Sequence[str], *, private_tmp: bool = False,
                 keep: Sequence[Path] = (), log: Path | None = None) -> subprocess.Popen[bytes]:
        """Start a daemon inside the host's network and UTS namespaces (it shows the host's name).

        private_tmp: give it (and its children) a mount namespace of its own with a fresh tmpfs
        on /tmp, as a real node has; the directories in `keep` that lie under /tmp (any number;
        the others stay visible anyway) are bound back in so shared files stay visible. The
        caller stops the process; close() ends whatever is left in the host's network namespace.
        """
        h = self.host(host) if isinstance(host, str) else host
        inner = list(argv)
        if private_tmp:
            # The real /tmp is opened before the tmpfs hides it, and each kept directory is
            # bound back from beneath that descriptor (a bind mount's source must be in the
            # caller's own mount namespace): one descriptor serves any number of them.
            kept = under_tmp(keep)
            hosts_file = h.dir / "hosts"
            # names_resolve: the daemon's mount namespace sees the bed's names too.
            names = ([f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts"]
                     if self.names_resolve and hosts_file.exists() else [])
            script = "\n".join([
                "n=$1; shift",
                *names,
                "exec 3</tmp",
                "mount -t tmpfs -o mode=1777 dtlaunch-tmp /tmp",
                'while [ "$n" -gt 0 ]; do',
                '  mkdir -p "/tmp/$1"',
                '  mount --no-canonicalize --bind "/proc/self/fd/3/$1" "/tmp/$1"',
                "  shift; n=$((n - 1))",
                "done",
                "exec 3<&-",
                'exec "$@"',
            ])
            inner = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec",
                     script, "sh", str(len(kept)), *kept, *argv]
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            return subprocess.Popen(self.nsenter_argv(h, inner), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log is not None:
                out.close()  # type: ignore[union-attr]

    def pids_in(self, host: BedHost | str) -> list[int]:
        """Every process in the host's network namespace (sshd included)."""
        h = self.host(host) if isinstance(host, str) else host
        out = _run("ip", "netns", "pids", h.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def stray_pids(self, host: BedHost | str) -> list[int]:
        """Processes in the host other than its sshd listener: what a finished job left."""
        h = self.host(host) if isinstance(host, str) else host
        keep = {h.sshd.pid} if h.sshd is not None else set()
        return [p for p in self.pids_in(h) if p not in keep]

    # --- sshd control -------------------------------------------------------------------------

    def _write_sshd_config(self, h: BedHost) -> Path:
        config = h.dir / "sshd_config"
        # sshd keeps the first value it reads for a keyword: a host's extra lines come first,
        # so that they override the defaults below (LogLevel DEBUG1 for a test that reads it).
        lines = [
            *h.sshd_extra,
            f"ListenAddress {h.address}",
            "Port 22",
            f"HostKey {h.host_key}",
            f"PidFile {h.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {h.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            f"MaxStartups {self.max_startups}",
            "MaxSessions 200",
            "LogLevel ERROR",
        ]
        config.write_text("\n".join(lines) + "\n")
        return config

    def start_sshd(self, host: BedHost | str, wait: bool = True) -> None:
        h = self.host(host) if isinstance(host, str) else host
        config = self._write_sshd_config(h)
        # ip netns exec -> unshare a UTS namespace -> set the hostname -> exec sshd (same pid).
        # names_resolve: /etc/hosts as the host sees it (`ip netns exec` gives it a mount
        # namespace of its own) also names every bed host, as a cluster's nodes resolve theirs.
        script = 'hostname "$1" && exec "$2" -D -f "$3" -E "$4"'
        hosts_file = h.dir / "hosts"
        if self.names_resolve:
            base = ""
            with contextlib.suppress(OSError):
                base = Path("/etc/hosts").read_text()
            hosts_file.write_text(base + "".join(f"{b.address} {b.name}\n" for b in self.hosts))
            script = 'mount --bind "$5" /etc/hosts && ' + script
        h.sshd = subprocess.Popen(
            ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--", "/bin/sh", "-c",
             script, "sh", h.name, SSHD, str(config), str(h.dir / "sshd.log"),
             str(hosts_file)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if wait:
            self._wait_listening(h)

    def _wait_listening(self, h: BedHost, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert h.sshd is not None
            if h.sshd.poll() is not None:
                log = (h.dir / "sshd.log").read_text() if (h.dir / "sshd.log").exists() else ""
                raise RuntimeError(f"sshd on {h.name} exited: {log.strip()}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((h.address, 22)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"sshd on {h.name} did not start listening within {timeout} s")

    def stop_sshd(self, host: BedHost | str) -> None:
        """Stop the listener (existing sessions survive, as with a real sshd restart)."""
        h = self.host(host) if isinstance(host, str) else host
        if h.sshd is not None and h.sshd.poll() is None:
            h.sshd.terminate()
            try:
                h.sshd.wait(5)
            except subprocess.TimeoutExpired:
                h.sshd.kill()
                h.sshd.wait(5)

    def kill_all_sshd(self, host: BedHost | str) -> None:
        """Kill the listener AND every session's sshd on the host, as if the host died."""
        h = self.host(host) if isinstance(host, str) else host
        for pid in self.pids_in(h):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    os.kill(pid, signal.SIGKILL)
        if h.sshd is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                h.sshd.wait(5)

    def restart_with_new_host_key(self, host: BedHost | str) -> None:
        """The host's key changes while known_hosts keeps the old one."""
        h = self.host(host) if isinstance(host, str) else host
        self.stop_sshd(h)
        h.host_key.unlink()
        h.host_key.with_suffix(".pub").unlink()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(h.host_key))
        self.start_sshd(h)

    def veth(self, host: BedHost | str) -> str:
        """The bridge-side end of the host's link (its eth0 is the other end)."""
        h = self.host(host) if isinstance(host, str) else host
        return f"dtv{self.bridge[len('dtb'):]}{self.hosts.index(h) + 1}"

    def set_link(self, host: BedHost | str, up: bool) -> None:
        """Take the host's link down: it stops answering without closing anything, as a
        machine that lost power would. ``up=True`` brings it back."""
        _run("ip", "link", "set", self.veth(host), "up" if up else "down")

    def ssh_argv(self, host: str, *command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), host, *command]

    # --- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def end(h: BedHost) -> None:
            # Every process in the namespace: sshd, sessions, anything a failed test left.
            for pid in self.pids_in(h):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if h.sshd is not None:
                with contextlib.suppress(Exception):
                    h.sshd.wait(5)
            _run("ip", "netns", "del", h.netns, check=False)

        _each(self.hosts, end)
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _each(hosts: Sequence[BedHost], work: Callable[[BedHost], None]) -> None:
    """work(host) for every host, a few at a time (a bed of 128 hosts builds in seconds, not a
    minute); every host is done even when one fails, then the first error is raised."""
    if len(hosts) <= 1:
        for h in hosts:
            work(h)
        return
    with ThreadPoolExecutor(max_workers=min(BUILD_WORKERS, len(hosts))) as pool:
        futures = [pool.submit(work, h) for h in hosts]
    for future in futures:
        future.result()


# What every Docker host carries: a bridge with the same address (Docker's default) and, while a
# container runs, a veth port in it, which gives the bridge a carrier.
DOCKER0_ADDRESS = "172.17.0.1/16"


def _add_docker0(netns: str) -> None:
    for argv in (["ip", "link", "add", "docker0", "type", "bridge"],
                 ["ip", "addr", "add", DOCKER0_ADDRESS, "dev", "docker0"],
                 ["ip", "link", "add", "vethc0", "type", "veth", "peer", "name", "vethc1"],
                 ["ip", "link", "set", "vethc0", "master", "docker0"],
                 ["ip", "link", "set", "vethc0", "up"],
                 ["ip", "link", "set", "vethc1", "up"],
                 ["ip", "link", "set", "docker0", "up"]):
        _run("ip", "netns", "exec", netns, *argv)


def build_testbed(n: int, sshd_extra: Mapping[str, Sequence[str]] | None = None,
                  docker0: bool = False, names_resolve: bool = False,
                  max_startups: str = "200") -> TestBed:
    """Build n hosts named h1..hn. The caller must close() it (or use `testbed()`).

    docker0: give every host a bridge `docker0` with the same 172.17.0.1/16, as Docker does
    (inside each host's namespace; removed with it)."""
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"a test bed has 1 to {MAX_HOSTS} hosts (one /24), not {n}")
    tag = secrets.token_hex(3)
    subnet = _pick_subnet()
    addrs = list(subnet.hosts())
    gateway = str(addrs[0])
    workdir = Path(tempfile.mkdtemp(prefix=f"dtlaunch-bed-{tag}-"))
    os.chmod(workdir, 0o700)
    bridge = f"dtb{tag}"
    hosts = [
        BedHost(name=f"h{i}", netns=f"dtl{tag}h{i}", address=str(addrs[9 + i]),
                dir=workdir / f"h{i}", sshd_extra=tuple((sshd_extra or {}).get(f"h{i}", ())))
        for i in range(1, n + 1)
    ]
    bed = TestBed(
        hosts=hosts, subnet=str(subnet), gateway=gateway, bridge=bridge, workdir=workdir,
        client_key=workdir / "id_ed25519", known_hosts=workdir / "known_hosts",
        ssh_config=workdir / "ssh_config", names_resolve=names_resolve,
        max_startups=max_startups,
    )
    atexit.register(bed.close)
    try:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"dtlaunch-bed-{tag}",
             "-f", str(bed.client_key))
        client_pub = bed.client_key.with_suffix(".pub").read_text()

        def make(h: BedHost) -> None:
            i = hosts.index(h) + 1
            h.dir.mkdir()
            veth = f"dtv{tag}{i}"
            _run("ip", "netns", "add", h.netns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                 "netns", h.netns)
            _run("ip", "link", "set", veth, "master", bridge, "up")
            # `ip -n` enters the namespace itself: one process per step, not two.
            _run("ip", "-n", h.netns, "addr", "add", f"{h.address}/{subnet.prefixlen}", "dev", "eth0")
            _run("ip", "-n", h.netns, "link", "set", "eth0", "up")
            _run("ip", "-n", h.netns, "link", "set", "lo", "up")
            if docker0:
                _add_docker0(h.netns)
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(h.host_key))
            h.authorized_keys.write_text(client_pub)

        _each(hosts, make)
        known = [f"{h.name},{h.address} {h.host_key.with_suffix('.pub').read_text()}" for h in hosts]
        bed.known_hosts.write_text("".join(known))
        config = [
            *(f"Host {h.name}\n  HostName {h.address}\n" for h in hosts),
            "Host *\n",
            "  User root\n",
            f"  IdentityFile {bed.client_key}\n",
            "  IdentitiesOnly yes\n",
            f"  UserKnownHostsFile {bed.known_hosts}\n",
            "  GlobalKnownHostsFile /dev/null\n",
            "  StrictHostKeyChecking yes\n",
            "  BatchMode yes\n",
            "  ConnectTimeout 5\n",
            "  LogLevel ERROR\n",
        ]
        bed.ssh_config.write_text("".join(config))
        # Every sshd starts at once, then each is waited for.
        for h in hosts:
            bed.start_sshd(h, wait=False)
        _each(hosts, bed._wait_listening)
    except BaseException:
        bed.close()
        raise
    return bed


@contextlib.contextmanager
def testbed(n: int, sshd_extra: Mapping[str, Sequence[str]] | None = None,
            docker0: bool = False) -> Iterator[TestBed]:
    bed = build_testbed(n, sshd_extra, docker0)
    try:
        yield bed
    finally:
        bed.close()
