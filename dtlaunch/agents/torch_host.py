"""A torch.distributed job's agent on one host: starts that host's workers with torchrun's
contract, and keeps the job's c10d store the job's alone.

How it arrives: as the Gloo agent does (dtlaunch.agents.gloo_host: a bootstrap on the command
line, everything else on standard input, nothing secret on a command line), as one text with
gloo_host's (whose rank handling it reuses) and c10d_store's (the store) before it; then one
line of JSON, the job. Standard input stays open for the job's life: its end ends every
worker here; SIGTERM, SIGINT or SIGHUP do the same.

Host 0's agent binds the master address (its address on the job's network: in one of the
job's subnets, else the address dtlaunch reaches it at) and port (--master-port, else one the
system gives), serves the store there (c10d_store.C10dStoreServer, which admits only the job's
processes: here by their sockets, from other hosts when their agent vouches), and reports the
address and port on stderr (`dtlaunch-torch: master ADDR PORT`); the fan-out then completes
the other hosts' jobs with them. Every other agent first connects its voucher to the store
(which proves the master port reachable from this host) and only then starts its workers.

Each worker gets MASTER_ADDR, MASTER_PORT, its own TORCHELASTIC_ERROR_FILE in a private
directory here (removed at the end) and, unless the job sets them, GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME: the interface this host reaches the master through. Host 0's agent serves
until its workers are done and every other host's agent and worker has gone; a failed worker
ends this agent at once (no exit barrier).

Standard library only, no dtlaunch imports, Python >= 3.7 (the ranks' interpreter).
"""

from __future__ import annotations  # no annotation is evaluated at run time

import json
import os
import shutil
import socket
import sys
import tempfile
import time

TYPE_CHECKING = False  # the checkers' name for it: the typing module is never imported here
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Dict, Tuple
if TYPE_CHECKING or __name__ != "dtlaunch_torch_host":
    # Shipped, this text follows gloo_host's and c10d_store's in one module; imported as a
    # module (tests, the checkers), it takes their names from its package.
    from .c10d_store import C10dStoreServer, C10dVoucher
    from .gloo_host import Agent, _in_cidr, gloo_iface, ipv4_ifaces, run

PREFIX = "dtlaunch-torch: "  # the Gloo agent's words (a rank that cannot start) say it too
CONNECT_TIMEOUT = 60.0  # seconds another host's agent may take to reach the store
SERVE_AFTER = 1.0  # host 0's poll while the other hosts finish


def master_address(c10d: Dict[str, Any]) -> str:
    """Host 0's address on the job's network: in one of its subnets (--iface CIDR or the
    pre-flight's choice), else the address dtlaunch reaches it at."""
    for cidr in c10d.get("cidrs") or ():
        for _, address in ipv4_ifaces():
            if _in_cidr(address, cidr):
                return address
    return str(c10d["addr"])


def hold_port(address: str, port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        listener.bind((address, port))
        listener.listen(1024)
    except OSError:
        listener.close()
        raise
    return listener


def say(text: str) -> None:
    sys.stderr.write(PREFIX + text + "\n")
    sys.stderr.flush()


class TorchAgent(Agent):
    def __init__(self, job: Dict[str, Any]) -> None:
        Agent.__init__(self, job)
        self.errors = tempfile.mkdtemp(prefix="dtlaunch-torch-")  # 0700: this user's alone

    def worker_env(self, master: Tuple[str, int]) -> Dict[str, str]:
        extra = {"MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])}
        # The interface this host reaches the master through ("lo" for a job on this machine).
        local = master[0].startswith("127.") or master[0] == "::1"
        ifname = "lo" if local else gloo_iface([], master)
        base = self.base_env()
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if ifname is not None and name not in base:
                extra[name] = ifname
        return extra

    def error_file(self, rank: Dict[str, Any]) -> Dict[str, str]:
        folder = os.path.join(self.errors, str(rank["env"].get("RANK", "x")))
        os.mkdir(folder, 0o700)
        return {"TORCHELASTIC_ERROR_FILE": os.path.join(folder, "error.json")}

    def close(self) -> None:
        shutil.rmtree(self.errors, ignore_errors=True)


def torch_main(stream: BinaryIO) -> int:
    try:
        job = json.loads(stream.readline().decode("utf-8"))
        c10d = job["c10d"]
        secret = bytes.fromhex(c10d["secret"])
        host = str(job["host"])
    except (ValueError, KeyError, TypeError):
        say("expected the job on standard input")
        return 2
    agent = TorchAgent(job)
    agent.stop_on_signals_and_eof()
    server = voucher = None
    try:
        if c10d.get("serve"):
            address = master_address(c10d)
            try:
                listener = hold_port(address, int(c10d.get("port") or 0))
            except OSError as exc:
                say("host %s: cannot hold the master port %s on %s: %s; give a free one with "
                    "--master-port" % (host, c10d.get("port") or "(any)", address,
                                       exc.strerror or exc))
                return 1
            server = C10dStoreServer(listener, secret, os.getpid())
            server.start()
            master = server.address
            say("master %s %d" % master)  # the fan-out completes the other hosts' jobs
        else:
            master = (str(c10d["addr"]), int(c10d["port"]))
            voucher = C10dVoucher(master, secret, os.getpid()).start()
            deadline = time.monotonic() + CONNECT_TIMEOUT
            while not voucher.connected.wait(0.1):
                if agent.stop.is_set():
                    return 143
                if time.monotonic() >= deadline:
                    say("host %s: cannot reach the job's store at %s:%d from this host within "
                        "%g s (a firewall between the hosts, or the wrong network: see "
                        "--iface)" % (host, master[0], master[1], CONNECT_TIMEOUT))
                    return 1
        code = agent.start_with(agent.worker_env(master), agent.error_file)
        if code is not None:
            agent.end_ranks()
            return code
        code = agent.wait()
        # Host 0 serves until every other host's agent has come and gone: its own workers may
        # end before another host's agent has even connected (a job that never uses the
        # store). A host whose agent fails ends the job through the fan-out (agent.stop).
        peers = int(c10d.get("peers") or 0)
        while code == 0 and server is not None and \
                (server.agents_seen < peers or server.connections) \
                and not agent.stop.wait(SERVE_AFTER):
            pass  # the other hosts' workers still use the store
        return code
    finally:
        if voucher is not None:
            voucher.close()
        if server is not None:
            server.close()
        agent.close()
        sys.stderr.flush()


if __name__ == "dtlaunch_torch_host":
    run(globals()["STREAM"], torch_main)  # given by the boot line
