"""The Prober over SSH: one paramiko connection and one remote command per host.

Connections and proxy processes still open are tracked, so `close()` (Ctrl-C, a deadline)
ends them all and nothing is left behind; a remote command ends when its channel closes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from dtlaunch.check.report import HOST, HostOutcome, unreachable
from dtlaunch.core.tracker import Tracker
from dtlaunch.reach.ssh_errors import SshFailure

if TYPE_CHECKING:
    from dtlaunch.probe.command import ProbeArgs
    from dtlaunch.reach.ssh_options import SshOptions


class SshProber:
    def __init__(self, options: SshOptions) -> None:
        self.options = options
        self.connect_timeout = float(options.connect_timeout)
        self._config: Any = None
        self._lock = threading.Lock()
        self._tracker = Tracker()

    def prepare(self) -> None:
        import encodings.idna  # noqa: F401  # a socket's connect to a host name encodes it
        import pwd  # noqa: F401  # getpass.getuser's, for the default login name

        import dtlaunch.check.facts
        import dtlaunch.probe.command
        import dtlaunch.reach.ssh_config
        import dtlaunch.ssh  # noqa: F401  # with it dtlaunch.reach's modules
        from dtlaunch.reach.target import import_paramiko

        import_paramiko()

    def _target(self, host: str) -> Any:
        from dtlaunch.reach.ssh_config import load_ssh_config, resolve_target

        with self._lock:
            if self._config is None:
                self._config = load_ssh_config(self.options.config_file)
            config = self._config
        return resolve_target(host, self.options, config)

    def probe(self, host: str, args: ProbeArgs, timeout: float) -> HostOutcome:
        from dtlaunch.check.facts import parse_probe_output
        from dtlaunch.probe.command import END_MARK, build_remote_command
        from dtlaunch.ssh import connect

        try:
            conn = connect(self._target(host), tracker=self._tracker)
            try:
                result = conn.run_remote(build_remote_command(args), timeout, END_MARK)
            finally:
                conn.close()
            facts = parse_probe_output(result.stdout)
            if not facts.hostname and result.exit_code != 0:
                tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
                return HostOutcome(host, HOST, problem=unreachable(
                    f"the remote command failed (exit {result.exit_code}): {tail}",
                    "the login shell must be POSIX-like (sh, bash, zsh); try "
                    f"'ssh {host} sh -c true'"))
            return HostOutcome(host, HOST, facts, note=conn.host_key_note)
        except SshFailure as exc:
            return HostOutcome(host, HOST, problem=unreachable(exc.detail, exc.hint))
        except Exception as exc:  # a bug or an odd server must not hide the other hosts' results
            return HostOutcome(host, HOST, problem=unreachable(
                f"{type(exc).__name__}: {exc}", f"try 'ssh -v {host} true'"))

    def verify(self, host: str) -> str | None:
        from dtlaunch.ssh import verify_host_key

        try:
            verify_host_key(self._target(host), tracker=self._tracker)
        except SshFailure as exc:
            return exc.kind
        return None

    def close(self) -> None:
        self._tracker.close_all()
