"""A throwaway prototype for bench/gloo_hop.py, never part of dtlaunch: on PYTHONPATH, it makes
`dtlaunch run --gloo` start its fan-out without the extra hop, so the hop's cost can be paired
against its absence.

Where dtlaunch would start `lifeline.py -> gloo_start.py` (a new interpreter, its imports,
then one link per host), this forks dtlaunch itself and runs gloo_start's main() in the child:
no exec, no interpreter start, no import; the links (rsh.py -> ssh, or a local host's agent)
are started from dtlaunch's own image, as they would be if run/execute started them itself.
What the prototype does not keep: the lifeline (a SIGKILLed dtlaunch would leave the fan-out
running), so it is for timing only.
"""

import contextlib
import os
import sys


def _patch(execute):
    original = execute.spawn

    def spawn(argv, env, stdin_pipe=False):
        if not argv or not str(argv[-1]).endswith("gloo_start.py"):
            return original(argv, env, stdin_pipe)
        return _forked_fanout(env)

    execute.spawn = spawn


class _Proc:
    """What execute() uses of a Popen: pid, stdin, wait, send_signal, returncode."""

    def __init__(self, pid, stdin):
        self.pid, self.stdin, self.returncode = pid, stdin, None

    def wait(self):
        while self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self):
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


def _forked_fanout(env):
    import signal

    from dtlaunch.agents import gloo_start
    from dtlaunch.run.spool import Spool

    spools = (Spool(), Spool())
    read_in, write_in = os.pipe()
    guard_read, guard_write = os.pipe()  # execute() closes the write end at the job's end
    os.close(guard_read)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.setsid()
            os.close(write_in)  # else its input never ends: the job is one line, no newline
            os.close(guard_write)
            os.dup2(read_in, 0)
            os.dup2(spools[0].fd, 1)
            os.dup2(spools[1].fd, 2)
            os.environ.clear()
            os.environ.update(env)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            code = gloo_start.main()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
        finally:
            os._exit(code)
    os.close(read_in)
    return _Proc(pid, os.fdopen(write_in, "wb")), spools, guard_write


class _Finder:
    """Patches dtlaunch.run.execute as it is first imported, nothing else."""

    def find_spec(self, name, path, target=None):
        if name != "dtlaunch.run.execute":
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
