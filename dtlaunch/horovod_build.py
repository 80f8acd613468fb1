"""Build and install Horovod for the PyTorch and Open MPI at hand.

`pip install horovod` (0.28.1, the last release) fails against PyTorch >= 2.1 because its
CMake files ask for C++14 while PyTorch's headers need C++17. This builds the released sdist
with C++17, MPI + Gloo (+ NCCL when PyTorch has CUDA) and caches the wheel, keyed by every
version it depends on, so a second set-up installs it in seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dtlaunch.errors import DtlaunchError

HOROVOD_VERSION = "0.28.1"
CMAKE_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")
DOWNLOAD_TIMEOUT = 300
BUILD_TIMEOUT = 3600


@dataclass(frozen=True)
class BuildKey:
    horovod: str
    torch: str
    python: str
    mpi: str
    cuda: str | None

    def tag(self) -> str:
        cuda = f"-cuda{self.cuda}" if self.cuda else "-cpu"
        return f"horovod{self.horovod}-torch{self.torch}-py{self.python}-ompi{self.mpi}{cuda}"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dtlaunch" / "wheels"


def build_env(key: BuildKey, environ: dict[str, str]) -> dict[str, str]:
    """Horovod's build switches: PyTorch only, MPI and Gloo controllers, NCCL with CUDA."""
    env = dict(environ)
    env.update(
        HOROVOD_WITH_PYTORCH="1",
        HOROVOD_WITHOUT_TENSORFLOW="1",
        HOROVOD_WITHOUT_MXNET="1",
        HOROVOD_WITH_MPI="1",
        HOROVOD_WITH_GLOO="1",
        MAKEFLAGS=f"-j{os.cpu_count() or 1}",
    )
    if key.cuda:
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    return env


def patch_cxx_standard(source: Path) -> None:
    """Raise the C++ standard from 14 to 17 where Horovod sets it for itself and for torch."""
    for name in CMAKE_FILES:
        path = source / name
        text = path.read_text()
        patched, count = re.subn(r"set\(CMAKE_CXX_STANDARD 14\)", "set(CMAKE_CXX_STANDARD 17)", text)
        if count == 0 and "CMAKE_CXX_STANDARD 17" not in text:
            raise DtlaunchError(f"unexpected Horovod source: no C++ standard setting in {name}")
        path.write_text(patched)


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> None:
    print("+ " + " ".join(argv), flush=True)
    try:
        subprocess.run(argv, check=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.CalledProcessError as exc:
        raise DtlaunchError(f"{argv[0]} {argv[1]} failed with status {exc.returncode}") from None
    except subprocess.TimeoutExpired:
        raise DtlaunchError(f"{' '.join(argv[:3])} took longer than {timeout:g} s") from None


def current_key() -> BuildKey:
    try:
        import torch
    except ImportError:
        raise DtlaunchError("PyTorch is not installed: 'pip install torch' first") from None
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise DtlaunchError("mpirun not found: 'apt-get install openmpi-bin libopenmpi-dev'")
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    match = re.search(r"\(Open MPI\)\s+(\S+)", out.stdout)
    if not match:
        raise DtlaunchError(f"{mpirun} is not Open MPI; Horovod is built here against Open MPI")
    return BuildKey(
        horovod=HOROVOD_VERSION,
        torch=str(torch.__version__),
        python=f"{sys.version_info.major}{sys.version_info.minor}",
        mpi=match.group(1),
        cuda=torch.version.cuda,
    )


def installed_ok() -> bool:
    """Horovod imports with PyTorch and was built with MPI."""
    code = "import horovod.torch as h; raise SystemExit(0 if h.mpi_built() else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


def build_wheel(key: BuildKey, dest: Path) -> Path:
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="dtlaunch-horovod-") as tmp:
        work = Path(tmp)
        _run([*pip, "download", "--no-deps", "--no-binary", ":all:", f"horovod=={key.horovod}",
              "-d", str(work)], DOWNLOAD_TIMEOUT)
        sdist = next(work.glob("horovod-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        source = work / f"horovod-{key.horovod}"
        patch_cxx_standard(source)
        out = work / "wheel"
        _run([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(out), str(source)],
             BUILD_TIMEOUT, env=build_env(key, dict(os.environ)))
        built = next(out.glob("horovod-*.whl"))
        dest.mkdir(parents=True, exist_ok=True)
        final = dest / built.name
        shutil.copy2(built, final)
        return final


def install_horovod(force: bool = False) -> str:
    """Install Horovod (from the cache when possible); returns what was done."""
    if not force and installed_ok():
        return "Horovod is already installed with PyTorch and MPI"
    key = current_key()
    dest = cache_dir() / key.tag()
    wheels = sorted(dest.glob("horovod-*.whl"))
    if force or not wheels:
        wheels = [build_wheel(key, dest)]
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheels[0])],
         600)
    if not installed_ok():
        raise DtlaunchError("Horovod installed but does not import with MPI; see the build log above")
    return f"installed {wheels[0].name} ({key.tag()})"
