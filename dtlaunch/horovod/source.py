"""Horovod's source archive: unpacked safely on every supported Python, patched for C++17."""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path

from dtlaunch.core.errors import DtlaunchError

CMAKE_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")


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
