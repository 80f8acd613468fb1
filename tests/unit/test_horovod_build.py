"""dtlaunch install-horovod's pure parts and its failure paths: which MPI, which cache entry,
safe unpacking on Pythons without tarfile's filters, one-line errors instead of tracebacks."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
from helpers.suite import dtlaunch_argv

from dtlaunch.core.errors import DtlaunchError, UsageError
from dtlaunch.horovod import build as horovod_build
from dtlaunch.horovod.build import BuildKey, build_env, cache_dir, extract_sdist, find_mpi


def fake_launcher(folder: Path, name: str, banner: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{banner}\nEOF\n")
    path.chmod(0o755)
    return path


def make_archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o4755 if kind == tarfile.REGTYPE else 0o755
    return info


@pytest.fixture
def old_tarfile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python from before the extraction filters (3.9-3.11 before their security releases)."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    original = tarfile.TarFile.extractall

    def extractall(self: tarfile.TarFile, path: str = ".", members: object = None, *,
                   numeric_owner: bool = False) -> None:
        original(self, path, members, numeric_owner=numeric_owner)  # type: ignore[arg-type]

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def test_extract_without_filter_argument(tmp_path: Path, old_tarfile: None) -> None:
    archive = make_archive(tmp_path / "h.tar.gz", [(member("horovod-0.28.1", tarfile.DIRTYPE), b""),
                                                   (member("horovod-0.28.1/setup.py"), b"x = 1\n")])
    dest = tmp_path / "out"
    dest.mkdir()
    extract_sdist(archive, dest)
    extracted = dest / "horovod-0.28.1" / "setup.py"
    assert extracted.read_text() == "x = 1\n"
    assert not extracted.stat().st_mode & stat.S_ISUID


@pytest.mark.parametrize("bad", [member("../evil.py"), member("/tmp/evil.py"),
                                 member("h/link", tarfile.SYMTYPE, "/etc/passwd"),
                                 member("h/fifo", tarfile.FIFOTYPE)])
def test_extract_refuses_unsafe_members_without_filter(tmp_path: Path, old_tarfile: None,
                                                       bad: tarfile.TarInfo) -> None:
    archive = make_archive(tmp_path / "h.tar.gz", [(bad, b"")])
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(DtlaunchError, match="refusing"):
        extract_sdist(archive, dest)
    assert not (tmp_path / "evil.py").exists()


def test_extract_with_filter_refuses_traversal(tmp_path: Path) -> None:
    if not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile filters")
    archive = make_archive(tmp_path / "h.tar.gz", [(member("../evil.py"), b"")])
    (tmp_path / "out").mkdir()
    with pytest.raises(tarfile.TarError):
        extract_sdist(archive, tmp_path / "out")


def test_find_mpi_open_mpi5_in_a_venv(tmp_path: Path) -> None:
    fake_launcher(tmp_path / "venv" / "bin", "mpirun", "mpirun (Open MPI) 5.0.11")
    path = os.pathsep.join([str(tmp_path / "venv" / "bin"), "/usr/bin"])
    found = find_mpi(path=path)
    assert found.launcher == str(tmp_path / "venv" / "bin" / "mpirun")
    assert found.prefix == str(tmp_path / "venv")
    assert (found.impl.name, found.impl.version) == ("Open MPI", "5.0.11")


def test_find_mpi_mpich_by_mpiexec(tmp_path: Path) -> None:
    launcher = fake_launcher(tmp_path / "v" / "bin", "mpiexec",
                             "HYDRA build details:\n    Version:        5.0.2")
    found = find_mpi(str(launcher))
    assert (found.impl.name, found.impl.version) == ("MPICH", "5.0.2")


def key_for(launcher: Path) -> BuildKey:
    return BuildKey("0.28.1", "2.13.0+cpu", "311", find_mpi(str(launcher)), None)


def test_cache_key_differs_per_implementation_version_and_install(tmp_path: Path) -> None:
    a = key_for(fake_launcher(tmp_path / "a" / "bin", "mpirun", "mpirun (Open MPI) 5.0.11"))
    b = key_for(fake_launcher(tmp_path / "b" / "bin", "mpirun", "mpirun (Open MPI) 5.0.11"))
    c = key_for(fake_launcher(tmp_path / "c" / "bin", "mpirun", "mpirun (Open MPI) 4.1.4"))
    d = key_for(fake_launcher(tmp_path / "d" / "bin", "mpiexec", "HYDRA\n Version: 5.0.2"))
    tags = {a.tag(), b.tag(), c.tag(), d.tag()}
    assert len(tags) == 4
    assert "-ompi5.0.11-" in a.tag() and "-ompi4.1.4-" in c.tag() and "-mpich5.0.2-" in d.tag()


def test_build_env_puts_that_mpi_first(tmp_path: Path) -> None:
    launcher = fake_launcher(tmp_path / "v" / "bin", "mpirun", "mpirun (Open MPI) 5.0.11")
    fake_launcher(tmp_path / "v" / "bin", "mpicc", "")
    (tmp_path / "v" / "include").mkdir()
    (tmp_path / "v" / "include" / "mpi.h").write_text("")
    env = build_env(key_for(launcher), {"PATH": "/usr/bin"})
    assert env["PATH"] == os.pathsep.join([str(tmp_path / "v" / "bin"), "/usr/bin"])
    assert env["MPI_HOME"] == str(tmp_path / "v")
    assert env["MPICC"] == str(tmp_path / "v" / "bin" / "mpicc")
    assert "MPICXX" not in env and env["HOROVOD_WITH_MPI"] == "1"


def test_build_env_points_intel_mpis_wrappers_at_its_prefix(tmp_path: Path) -> None:
    """PyPI's impi-devel: mpicc's prefix is a placeholder, I_MPI_ROOT gives the real one."""
    launcher = fake_launcher(tmp_path / "impi" / "bin", "mpiexec",
                             "Intel(R) MPI Library for Linux* OS, Version 2021.18 Build 20250501")
    env = build_env(key_for(launcher), {"PATH": "/usr/bin", "I_MPI_ROOT": "/opt/intel/mpi/old"})
    assert env["I_MPI_ROOT"] == str(tmp_path / "impi")
    assert "-impi2021.18-" in key_for(launcher).tag()
    mpich = fake_launcher(tmp_path / "m" / "bin", "mpiexec", "HYDRA\n Version: 5.0.2")
    assert "I_MPI_ROOT" not in build_env(key_for(mpich), {"PATH": "/usr/bin"})


def test_cache_dir_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = cache_dir()
    assert stat.S_IMODE((tmp_path / "cache" / "dtlaunch").stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_cache_dir_made_before_is_tightened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dtlaunch" / "wheels").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "dtlaunch", 0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache_dir()
    assert stat.S_IMODE((tmp_path / "dtlaunch").stat().st_mode) == 0o700


def test_launcher_that_hangs_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hang = tmp_path / "mpirun"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(horovod_build, "VERSION_TIMEOUT", 0.5)
    with pytest.raises(DtlaunchError, match=r"took longer than 0\.5 s"):
        find_mpi(str(hang))


def test_launcher_that_cannot_start_is_one_error(tmp_path: Path) -> None:
    broken = tmp_path / "mpirun"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    with pytest.raises(DtlaunchError, match="cannot run"):
        find_mpi(str(broken))


def test_not_an_executable(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not an executable file"):
        find_mpi(str(tmp_path / "nothing"))


def test_run_failure_modes_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DtlaunchError, match="cannot run"):
        horovod_build._run([str(tmp_path / "missing-pip"), "install"], 10)
    with pytest.raises(DtlaunchError, match="took longer than"):
        horovod_build._run(["sleep", "30"], 0.3)
    with pytest.raises(DtlaunchError, match="failed with status 3"):
        horovod_build._run(["sh", "-c", "exit 3"], 10)


def test_cli_broken_mpi_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "mpirun"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    done = subprocess.run(dtlaunch_argv("install-horovod", "--mpi", str(broken)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"dtlaunch: error: {broken} --version: cannot run {broken}: No such file or directory"]


def test_patch_cxx_standard(tmp_path: Path) -> None:
    for name in horovod_build.CMAKE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("set(CMAKE_CXX_STANDARD 14)\n")
    horovod_build.patch_cxx_standard(tmp_path)
    assert "17" in (tmp_path / "CMakeLists.txt").read_text()


def test_launcher_asked_by_the_name_it_was_found_as(tmp_path: Path) -> None:
    """Debian's mpirun links to orterun, which names itself OpenRTE under its own name."""
    bin_dir = tmp_path / "usr" / "bin"
    fake_launcher(bin_dir, "orterun", "")
    (bin_dir / "orterun").write_text('#!/bin/sh\ncase "$0" in\n*mpirun) echo "mpirun (Open MPI) '
                                     '4.1.4";;\n*) echo "orterun (OpenRTE) 4.1.4";;\nesac\n')
    (bin_dir / "mpirun").symlink_to("orterun")
    found = find_mpi(path=str(bin_dir))
    assert (found.impl.name, found.impl.version) == ("Open MPI", "4.1.4")
    assert found.launcher == str(bin_dir / "mpirun") and found.prefix == str(tmp_path / "usr")


def test_a_wheel_cache_that_is_a_link_or_not_private_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """install-horovod installs what it finds there: another user's world-writable directory
    behind a link must never be it (the run's caches refuse it the same way)."""
    shared = tmp_path / "shared"
    (shared / "wheels").mkdir(parents=True)
    os.chmod(shared, 0o777)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "dtlaunch").symlink_to(shared)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with pytest.raises(DtlaunchError, match=r"wheel cache.*symbolic link"):
        cache_dir()  # before: the shared directory, wheels and all
    (cache / "dtlaunch").unlink()
    (cache / "dtlaunch").mkdir(mode=0o700)
    (cache / "dtlaunch" / "wheels").symlink_to(shared / "wheels")
    with pytest.raises(DtlaunchError, match=r"wheel cache.*symbolic link"):
        cache_dir()


def test_only_private_wheels_of_ours_are_taken_from_the_cache(tmp_path: Path) -> None:
    from dtlaunch.horovod.build import cached_wheels

    good = tmp_path / "horovod-0.28.1-cp311-linux_x86_64.whl"
    good.write_bytes(b"w")
    os.chmod(good, 0o600)
    loose = tmp_path / "horovod-0.28.0-cp311-linux_x86_64.whl"
    loose.write_bytes(b"w")
    os.chmod(loose, 0o666)
    (tmp_path / "horovod-0.27.0-cp311-linux_x86_64.whl").symlink_to(good)
    assert cached_wheels(tmp_path) == [good]
