"""mpirun's SSH agent: runs ssh with dtlaunch's options, and says so when the link to a host
is lost.

The ssh options (identity file, config file, port, ...) come from the environment
(`DTLAUNCH_SSH_ARGS`, a JSON list), never from mpirun's `plm_rsh_args`: Open MPI copies its MCA
parameters onto each daemon's command line inside double quotes, where a remote shell would
expand `$(...)` in a file name.

Open MPI ignores an ssh link that dies after its daemon started, so a host whose sshd dies
mid-job would leave the job hanging. ssh exits 255 both when the connection fails and when the
remote command itself exits 255, so ssh logs (-v -E) to a private file: a connection whose
remote exit status (or signal) arrived was not lost. Only a lost one gets the line that
dtlaunch watches for, and dtlaunch stops the job. ssh's own messages (not its debug lines) are
passed on to stderr as before.

Standard library only, and no dtlaunch imports: it starts with -I -S, once per host, so it
imports next to nothing (no `subprocess`, `json`, `signal`'s enums, `contextlib` or
`collections`; ssh is started with posix_spawn): about 12 ms of CPU per host, not 40.
"""

from __future__ import annotations  # no annotation is evaluated at run time

# ruff: noqa: SIM105  (try/except/pass here: contextlib would cost every host its import)
import os
import sys
import time

try:  # the C module itself: `signal` adds enums, which cost every host ~5 ms to import
    import _signal as signal
except ImportError:  # not CPython
    import signal  # type: ignore[no-redef]

TYPE_CHECKING = False  # the checkers' name for it: the typing module is never imported here
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# The words the rest of dtlaunch shares with this agent (through dtlaunch.agents).
__all__ = ["HOST_KEY_PREFIX", "LOST_PREFIX", "SSH_ARGS_ENV"]

LOST_PREFIX = "dtlaunch-rsh: lost the SSH connection to host "
# ssh refused the host's key (changed, or unknown under StrictHostKeyChecking=yes): the link
# was never made, so the host is not lost, and a restart would be refused the same way.
HOST_KEY_PREFIX = "dtlaunch-rsh: ssh refused the host key of host "
_HOST_KEY_REFUSED = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED")
SSH_ARGS_ENV = "DTLAUNCH_SSH_ARGS"
# OpenSSH options that take a value (from ssh(1)); the first other word is the host.
_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")
# What `ssh -v` logs about the remote command's end; a lost connection logs neither.
_REMOTE_ENDED = ("rtype exit-status ", "rtype exit-signal ")
# Lines that only -v adds (besides "debugN:"), left out of what is passed on.
_VERBOSE_ONLY = ("debug1: ", "debug2: ", "debug3: ", "Authenticated to ", "Transferred: ",
                 "Bytes per second: ", "OpenSSH_")


def without_quiet(args: Sequence[str]) -> tuple[list[str], str]:
    """The arguments less `-q` before the host, and the host ("?" when none). Intel MPI's Hydra
    runs `ssh -q -x HOST ...`; quiet, ssh would drop its own error lines ("Could not resolve
    hostname", "Host key verification failed") and leave empty the log that tells a lost link
    from a remote exit."""
    out: list[str] = []
    host: str | None = None
    skip = False
    for arg in args:
        if host is not None or skip:
            skip = False
        elif arg == "-q":
            continue
        elif arg.startswith("-") and len(arg) >= 2:
            skip = arg[-1] in _WITH_VALUE and len(arg) == 2
        else:
            host = arg
        out.append(arg)
    return out, "?" if host is None else host


def ssh_options(environ: Mapping[str, str]) -> list[str]:
    """dtlaunch's ssh options from the environment; none when unset or unreadable."""
    text = environ.get(SSH_ARGS_ENV, "[]")
    value: object = string_list(text)
    if value is None:  # not the plain form json.dumps writes: let json judge it
        import json

        try:
            value = json.loads(text)
        except ValueError:
            return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return []
    return value


def string_list(text: str) -> list[str] | None:
    """`text` as a JSON array of strings (what json.dumps writes for one), read with the
    json module's C string scanner alone (`json` imports `re`: ~10 ms for every host); None
    for anything else, which json.loads then reads."""
    try:
        from _json import scanstring
    except ImportError:
        return None
    end = len(text)

    def skip(i: int) -> int:
        while i < end and text[i] in " \t\n\r":
            i += 1
        return i

    i = skip(0)
    if text[i:i + 1] != "[":
        return None
    i = skip(i + 1)
    out: list[str] = []
    if text[i:i + 1] == "]":
        return out if skip(i + 1) == end else None
    while text[i:i + 1] == '"':
        try:
            word, i = scanstring(text, i + 1, True)
        except ValueError:
            return None
        out.append(word)
        i = skip(i)
        mark = text[i:i + 1]
        i = skip(i + 1)
        if mark == "]":
            return out if i == end else None
        if mark != ",":
            return None
    return None


def link_lost(code: int, log: str) -> bool:
    """ssh's 255 means a lost connection only if the remote command's end never arrived."""
    return code == 255 and not any(mark in log for mark in _REMOTE_ENDED)


def messages(log: str) -> str:
    """ssh's own messages from its -v log: what it would have printed without -v -E."""
    return "".join(line for line in log.splitlines(keepends=True)
                   if not line.startswith(_VERBOSE_ONLY))


def _private_log() -> tuple[str, int] | None:
    """A new empty file only this user can read, and a descriptor to read it later
    (tempfile would cost this start-up ~10 ms); None if no temporary folder takes one."""
    for folder in dict.fromkeys((os.environ.get("TMPDIR") or "/tmp", "/tmp")):
        path = os.path.join(folder, f"dtlaunch-ssh-{os.getpid()}-{os.urandom(8).hex()}.log")
        try:
            return path, os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
    return None


class _Child:
    """ssh, started as subprocess.Popen would start it (signals ignored here back at their
    defaults, no descriptor but 0, 1 and 2 inherited), without importing subprocess."""

    def __init__(self, argv: list[str]) -> None:
        # What mpirun left open beyond 0, 1 and 2 stays out of ssh (Popen's close_fds).
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            names = []
        for name in names:
            if int(name) > 2:
                try:
                    os.set_inheritable(int(name), False)
                except OSError:
                    pass  # the directory's own descriptor, gone already
        self.pid = os.posix_spawnp(argv[0], argv, os.environ,
                                   setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        self.code: int | None = None

    def poll(self) -> int | None:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self) -> int:
        while self.code is None:  # a forwarded signal's handler may run meanwhile
            _, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def send_signal(self, signum: int) -> None:
        if self.code is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def _read_log(log: tuple[str, int]) -> str:
    path, fd = log
    try:
        os.unlink(path)
    except OSError:
        pass
    with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def main(argv: Sequence[str] | None = None, end_with_parent: bool = False) -> int:
    parent = os.getppid()
    args, host = without_quiet(sys.argv[1:] if argv is None else argv)
    log = _private_log()
    verbose = ["-v", "-E", log[0]] if log is not None else []
    try:
        proc = _Child(["ssh", *verbose, *ssh_options(os.environ), *args])
    except OSError as exc:
        if log is not None:
            _read_log(log)
        sys.stderr.write(f"dtlaunch-rsh: cannot run ssh: {exc.strerror}\n")
        return 127

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    if end_with_parent and sys.platform.startswith("linux"):
        # Linux's PR_SET_PDEATHSIG: Hydra starts its launcher in a session of its own, out of
        # reach of dtlaunch's final SIGKILL of mpiexec's session, so a killed mpiexec left this
        # wrapper and its ssh (and the remote proxy and ranks) running. The SIGTERM is
        # forwarded.
        try:
            import ctypes  # only here: the Open MPI agent starts without it

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if end_with_parent and os.getppid() != parent:  # it died before the kernel was asked
        proc.send_signal(signal.SIGTERM)
    if log is not None:
        # ssh writes its version line as soon as it opens the log: from then on the name can
        # go, so nothing is left behind even if this wrapper is killed.
        while proc.poll() is None and os.fstat(log[1]).st_size == 0:
            time.sleep(0.005)
        try:
            os.unlink(log[0])
        except OSError:
            pass
    code = proc.wait()
    text = _read_log(log) if log is not None else None
    if text is not None:
        sys.stderr.write(messages(text))
    # Without a log (no temporary folder), every 255 counts as lost, as ssh(1) documents it.
    if text is not None and code == 255 and any(mark in text for mark in _HOST_KEY_REFUSED):
        sys.stderr.write(f"{HOST_KEY_PREFIX}{host} (Host key verification failed)\n")
    elif code == 255 and (text is None or link_lost(code, text)):
        sys.stderr.write(f"{LOST_PREFIX}{host} (ssh exit status 255)\n")
    sys.stderr.flush()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
