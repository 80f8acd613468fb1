"""The user's install path, in a fresh venv: `pip install <checkout>`, `pip install torch==X`,
`dtlaunch install-horovod`, and Horovod imports with its runtime dependencies installed.

The Horovod wheel comes from ~/.cache/dtlaunch/wheels, where the set-up's own install-horovod
left it for the same PyTorch, Python and MPI, so install-horovod takes seconds; PyTorch comes
from pip's own cache or wheel folders, the same version as the running venv's (never a bare
`torch`, which would fetch a CUDA build)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.suite import REPO

from dtlaunch.horovod.build import runtime_requirements

pytestmark = [pytest.mark.horovod, pytest.mark.slow]

HOROVOD_METADATA = """\
Metadata-Version: 2.1
Name: horovod
Version: 0.28.1
Requires-Dist: cloudpickle
Requires-Dist: psutil
Requires-Dist: pyyaml
Requires-Dist: dataclasses; python_version < "3.7"
Requires-Dist: packaging
Requires-Dist: cffi>=1.4.0
Requires-Dist: torch; extra == "pytorch"
Requires-Dist: pyspark>=3.0.0; python_version >= "3.8" and extra == "spark"
Requires-Dist: torch==1.4.0; extra == "dev"

"""


def test_runtime_requirements_leave_out_extras_and_other_pythons() -> None:
    assert runtime_requirements(HOROVOD_METADATA) == ["cloudpickle", "psutil", "pyyaml",
                                                     "packaging", "cffi>=1.4.0"]


def _run(argv: list[str], env: dict[str, str], timeout: float = 600,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with dtlaunch installed from a copy of the checkout and PyTorch, as a
    user's: no [train] extra, no Horovod."""
    from helpers.suite import require_horovod

    require_horovod()
    base = tmp_path_factory.mktemp("user")
    checkout = base / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, checkout / name)
    shutil.copytree(REPO / "dtlaunch", checkout / "dtlaunch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    made = _run([sys.executable, "-m", "venv", str(venv)], env, timeout=120)
    assert made.returncode == 0, made.stderr
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = _run([*pip, str(checkout)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    torch = f"torch=={importlib.metadata.version('torch')}"
    done = _run([*pip, torch], env)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv, env


def _python(venv: Path, code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _run([str(venv / "bin" / "python"), "-c", code], env, timeout=120)


def test_install_horovod_after_pip_install_gives_a_horovod_that_imports(
        user_venv: tuple[Path, dict[str, str]]) -> None:
    venv, env = user_venv
    torch_before = _python(venv, "import torch; print(torch.__version__)", env).stdout
    done = _run([str(venv / "bin" / "dtlaunch"), "install-horovod"], env, timeout=3600)
    assert done.returncode == 0, done.stdout + done.stderr
    check = _python(venv, "import cloudpickle, horovod.torch as h; print(h.mpi_built())", env)
    assert check.returncode == 0 and check.stdout.strip() == "True", check.stderr
    # The dependencies came in beside it; PyTorch stayed the build it was.
    assert _python(venv, "import torch; print(torch.__version__)", env).stdout == torch_before
    again = _run([str(venv / "bin" / "dtlaunch"), "install-horovod"], env)
    assert again.returncode == 0 and "already installed" in again.stdout, again.stderr


def test_a_horovod_that_does_not_import_is_named_with_the_imports_own_error(
        user_venv: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    venv, env = user_venv
    (tmp_path / "cloudpickle.py").write_text("raise ImportError('cloudpickle broken on purpose')\n")
    done = _run([str(venv / "bin" / "dtlaunch"), "install-horovod"],
                {**env, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == ("dtlaunch: error: Horovod installed, but it does not "
                                            "work: ImportError: cloudpickle broken on purpose")
