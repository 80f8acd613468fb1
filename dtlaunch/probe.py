"""The probe: one POSIX shell snippet per host that reports everything doctor checks.

It runs in ONE exec per host, through the login shell that sshd starts for a non-interactive
command, so it sees the PATH that mpirun's own ssh login will see. Every user-supplied value
travels as a positional parameter, quoted with `shlex.quote`, never spliced into the script.

Cost: `import torch` takes about a second of CPU, so versions come from the names of the
installed *.dist-info folders, and
the facts that need a real import (does torch import, Horovod's controllers and tensor
operations) are computed once per host in a subprocess and cached in
`~/.cache/dtlaunch/imports-<key>.json` (mode 0600), keyed by the interpreter and the mtimes and
versions of the installed torch and horovod packages, so any reinstall recomputes them. A file
lock makes concurrent probes on a shared home directory compute them once.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from dtlaunch.facts import HostFacts, parse_probe_output

# Runs under the interpreter that `run` will use (any Python >= 3.6). argv: script module.
PYTHON_PROBE = r'''
import json, os, sys

IMPORT_CODE = r"""
import glob, json, os
r = {}
try:
    import torch
    r["torch"] = torch.__version__
    r["torch_cuda"] = getattr(torch.version, "cuda", None)
    try:
        r["torch_nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except BaseException:
        r["torch_nccl"] = None
except BaseException as e:
    r["torch_error"] = (type(e).__name__ + ": " + str(e)).strip()[:300]
try:
    import horovod
    r["horovod"] = getattr(horovod, "__version__", None)
    base = os.path.dirname(horovod.__file__)
    r["frameworks"] = [n for d, n in (("tensorflow", "TensorFlow"), ("torch", "PyTorch"),
                       ("mxnet", "MXNet")) if glob.glob(os.path.join(base, d, "mpi_lib*"))]
    if "torch" in r:
        import horovod.torch as hvd
        r["controllers"] = [n for n, f in (("MPI", hvd.mpi_built), ("Gloo", hvd.gloo_built))
                            if f()]
        r["tensor_ops"] = [n for n, f in (("NCCL", hvd.nccl_built), ("DDL", hvd.ddl_built),
                           ("CCL", hvd.ccl_built), ("MPI", hvd.mpi_built),
                           ("Gloo", hvd.gloo_built)) if f()]
except BaseException as e:
    r["horovod_error"] = (type(e).__name__ + ": " + str(e)).strip()[:300]
print(json.dumps(r))
"""


def stamp(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def find_dists(wanted):
    """Installed versions from *.dist-info names on sys.path: importlib.metadata costs ~30 ms."""
    found = {}
    for entry in sys.path:
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            dist, _, version = name.rsplit(".", 1)[0].partition("-")
            key = dist.lower().replace("-", "_")
            if key in wanted and key not in found:
                found[key] = (version.split("-")[0], os.path.join(folder, name))
    return found


def import_key(dists):
    import hashlib
    exe = os.path.realpath(sys.executable)
    parts = ["probe-3", sys.executable, exe, stamp(exe), sys.version]
    for name in ("torch", "horovod"):
        version, path = dists.get(name, (None, None))
        parts.append([name, version, path, stamp(path) if path else None])
        if path:
            package = os.path.join(os.path.dirname(path), name)
            parts.append([package, stamp(package), stamp(os.path.join(package, "torch"))])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def compute_imports():
    import subprocess
    try:
        done = subprocess.run([sys.executable, "-c", IMPORT_CODE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=120)
    except subprocess.TimeoutExpired:
        return {"torch_error": "importing torch/horovod took more than 120 s"}, False
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1]), True
    except (IndexError, ValueError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"torch_error": "import crashed (status %s): %s" % (done.returncode, tail[0])}, False


def imports(dists):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "dtlaunch")
    key = import_key(dists)
    path = os.path.join(folder, "imports-" + key + ".json")
    try:
        with open(path) as handle:
            return json.load(handle), True
    except (OSError, ValueError):
        pass
    lock = None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        import fcntl
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as handle:
                return json.load(handle), True
        except (OSError, ValueError):
            pass
    except (OSError, ImportError):
        pass
    try:
        facts, keep = compute_imports()
        if keep and lock is not None:
            tmp = path + ".%d.tmp" % os.getpid()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(facts, handle)
            os.replace(tmp, path)
        return facts, False
    finally:
        if lock is not None:
            os.close(lock)


def main():
    script, module, want_imports = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    out = {"executable": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3])}
    dists = find_dists(("torch", "horovod"))
    for dist in ("torch", "horovod"):
        out[dist] = dists[dist][0] if dist in dists else None
    if module:
        import importlib.util
        try:
            out["module_found"] = importlib.util.find_spec(module.split(".")[0]) is not None
        except Exception:
            out["module_found"] = False
    if want_imports:
        try:
            out["imports"], out["cached"] = imports(dists)
        except Exception as e:
            out["imports"] = {"torch_error": "probe failed: %s" % e}
    print(json.dumps(out))


main()
'''

# argv: $1 python, $2 script, $3 module, $4 working directory, $5 the Python probe,
# $6 peers (space separated, names already validated), $7 ssh options for peers, $8 imports 0/1
SHELL_PROBE = r"""
cd "$4" 2>/dev/null || true
echo @@hostname; uname -n
echo @@path; printf '%s\n' "$PATH"
echo @@mpirun; command -v mpirun 2>/dev/null
echo @@orted; command -v orted 2>/dev/null
echo @@mpirun_version
if command -v mpirun >/dev/null 2>&1; then
  if command -v timeout >/dev/null 2>&1; then timeout 10 mpirun --version 2>&1 | head -n 5
  else mpirun --version 2>&1 | head -n 5; fi
fi
echo @@ip_link; ip -o link show 2>/dev/null
echo @@ip_addr; ip -o addr show 2>/dev/null
echo @@script
if [ -n "$2" ]; then if [ -f "$2" ]; then echo yes; else echo no; fi; fi
echo @@python
found=no
case "$1" in
  */*) [ -f "$1" ] && [ -x "$1" ] && found=yes ;;
  *) command -v "$1" >/dev/null 2>&1 && found=yes ;;
esac
if [ "$found" = yes ]; then "$1" -c "$5" "$2" "$3" "$8" 2>&1 </dev/null
else echo '{"missing": true, "error": "no such file or not executable"}'; fi
echo @@peers
if [ -n "$6" ]; then
  set -f
  for peer in $6; do
    ( msg=$(ssh $7 "$peer" true 2>&1 </dev/null); rc=$?
      echo "$peer $rc $(printf '%s' "$msg" | tail -n 1)" ) &
  done
  wait
fi
echo @@end
"""


@dataclass(frozen=True)
class ProbeArgs:
    python: str
    script: str | None = None  # absolute path
    module: str | None = None
    cwd: str = ""
    peers: tuple[str, ...] = ()
    peer_ssh_args: tuple[str, ...] = ()
    imports: bool = True

    def positional(self) -> tuple[str, ...]:
        return (
            self.python,
            self.script or "",
            self.module or "",
            self.cwd,
            PYTHON_PROBE,
            " ".join(self.peers),
            " ".join(self.peer_ssh_args),
            "1" if self.imports else "0",
        )


def build_local_argv(args: ProbeArgs) -> tuple[str, ...]:
    return ("sh", "-c", SHELL_PROBE, "dtlaunch-probe", *args.positional())


def build_remote_command(args: ProbeArgs) -> str:
    """One command string for sshd's login shell, every piece quoted."""
    return " ".join(shlex.quote(p) for p in build_local_argv(args))


def probe_local(args: ProbeArgs, timeout: float = 180.0) -> HostFacts:
    """The same probe on the launcher, in dtlaunch's own environment (what mpirun inherits)."""
    done = subprocess.run(list(build_local_argv(args)), capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=timeout,
                          env=dict(os.environ))
    return parse_probe_output(done.stdout.decode(errors="replace"))


def peer_names(all_hosts: Sequence[str], me: str) -> tuple[str, ...]:
    return tuple(h for h in all_hosts if h != me)
