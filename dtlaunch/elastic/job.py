"""An elastic job put together: the rendezvous store with the driver's scopes, the driver, and
the fan-out (dtlaunch.agents.gloo_start, as for a fixed Gloo job) that gets each host's agent
as the driver first assigns it ranks, on its standard input, which stays open: its end ends
every agent (the driver finished, or dtlaunch stopped the job)."""

from __future__ import annotations

import contextlib
import json
import queue
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from dtlaunch import agents
from dtlaunch.core.errors import DtlaunchError
from dtlaunch.elastic.driver import DRAIN_HOLD, ElasticDriver, Say
from dtlaunch.gloo.rendezvous import Store, new_secret
from dtlaunch.gloo.start import agent_job, host_entry, store_address
from dtlaunch.job.elastic import ElasticSpec
from dtlaunch.reach.ssh_options import SshOptions


@dataclass
class ElasticJob:
    argv: tuple[str, ...]
    env: dict[str, str]
    store: Store
    driver: ElasticDriver
    feed: Callable[[IO[bytes]], None]  # writes the fan-out's input for the job's life


def prepare_elastic_job(spec: ElasticSpec, initial: Mapping[str, int], discover: Callable[[], dict[str, int]],
                        common_env: Mapping[str, str], shim_argv: Sequence[str], python: str,
                        ssh: SshOptions, launcher_env: Mapping[str, str], *,
                        host_iface: Callable[[str], str | None] = lambda host: None,
                        iface_cidrs: Sequence[str] = (), via_srun: bool = False,
                        node_address: Callable[[str], str | None] = lambda host: None,
                        admit: Callable[[str], str | None] = lambda host: None,
                        say: Say = lambda level, text: None) -> ElasticJob:
    secret = new_secret()
    addresses = {h: store_address(h, ssh, node_address(h)) for h in initial}
    store = Store(sorted(set(addresses.values())), secret)
    lines: queue.Queue[bytes] = queue.Queue()

    def start_host(host: str, token: int) -> None:
        try:
            where = addresses.get(host) or store_address(host, ssh, node_address(host))
            store.listen_also(where)
        except DtlaunchError as exc:
            # Its agent would never reach the store: the driver takes the host for lost.
            say("warning", f"elastic: host {host} cannot be started: {exc}")
            return
        addresses[host] = where
        env = dict(common_env)
        iface = host_iface(host)
        if iface is not None:
            env["HOROVOD_GLOO_IFACE"] = iface
        job = agent_job(host, where, store.port, secret, env, shim_argv, iface_cidrs, via_srun)
        job.update(elastic=True, token=token, round_timeout=spec.timeout + DRAIN_HOLD + 120)
        lines.put(json.dumps(host_entry(host, job, python, via_srun)).encode() + b"\n")

    def admit_safely(host: str) -> str | None:
        try:
            addresses.setdefault(host, store_address(host, ssh, node_address(host)))
        except Exception as exc:
            return str(exc)
        return admit(host)

    driver = ElasticDriver(spec, discover, start_host, store.reset_round, admit=admit_safely,
                           say=say)
    store.hooks = driver.hooks()
    store.start()

    def feed(stdin: IO[bytes]) -> None:
        try:
            stdin.write(json.dumps({"elastic": True, "hosts": []}).encode() + b"\n")
            stdin.flush()
            while True:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    if driver.finished:
                        break
                    continue
                stdin.write(line)
                stdin.flush()
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError, ValueError):
                stdin.close()

    try:
        driver.start(initial)
    except BaseException:
        store.close()
        raise
    fanout = tuple(agents.ship("gloo_start.py").here())
    return ElasticJob(fanout, dict(launcher_env), store, driver, feed)
