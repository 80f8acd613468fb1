"""Peer tests' material, fetched unmodified from a package registry, never copied into the
repository: PyTorch's own launcher test clients (`test/distributed/launcher/bin/` of its
source), from Debian's source package of PyTorch (the upstream tarball, checked by the SHA-256
the archive publishes). Cached under ~/.cache/dtlaunch/peer/; a fetch that fails fails the
test that needs it (CI reaches the Debian archive, as its set-up's apt-get does)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

# Debian 12's pytorch source package: its upstream tarball and the checksum in its .dsc.
PYTORCH_ORIG = "pool/main/p/pytorch/pytorch_1.13.1+dfsg.orig.tar.xz"
PYTORCH_SHA256 = "d0355588b8528566d477e6ebf1b4d9d036a6fd75711339f66b27472ce5879dc7"
PYTORCH_BIN = "pytorch-1.13.1/test/distributed/launcher/bin/"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
TIMEOUT = 120.0  # seconds for the whole download's every read


def debian_mirrors() -> list[str]:
    """The Debian archives this machine's apt uses (deb822 `URIs:` or one-line `deb` entries),
    then Debian's own, so a CI machine behind its own mirror fetches from it."""
    found: list[str] = []
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = path.read_text()
            found += re.findall(r"^URIs:\s*(\S+)", text, re.M)
            found += re.findall(r"^deb(?:-src)?\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M)
    mirrors = [u.rstrip("/") for u in found if u.rstrip("/").endswith("/debian")]
    return list(dict.fromkeys([*mirrors, DEFAULT_MIRROR]))


def _download(url: str, into: Path) -> str:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response, into.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def pytorch_launcher_scripts(cache: Path | None = None) -> Path:
    """The folder holding PyTorch's launcher test clients (test_script.py, test_script.sh,
    test_script_local_rank.py, test_script_init_method.py,
    test_script_is_torchelastic_launched.py), as its source tarball has them."""
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"),
                          "dtlaunch", "peer")
    folder = cache / "pytorch-1.13.1-launcher-bin"
    if (folder / "test_script.py").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    errors = []
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        tarball = Path(tmp) / "pytorch.orig.tar.xz"
        for mirror in debian_mirrors():
            try:
                got = _download(f"{mirror}/{PYTORCH_ORIG}", tarball)
            except OSError as exc:
                errors.append(f"{mirror}: {exc}")
                continue
            if got == PYTORCH_SHA256:
                break
            errors.append(f"{mirror}: SHA-256 {got}, not {PYTORCH_SHA256}")
        else:
            raise RuntimeError("cannot fetch PyTorch's source from the Debian archive: "
                               + "; ".join(errors))
        staged = Path(tmp) / "bin"
        staged.mkdir()
        with tarfile.open(tarball, "r:xz") as tar:
            for member in tar:
                if member.isfile() and member.name.startswith(PYTORCH_BIN):
                    name = member.name[len(PYTORCH_BIN):]
                    if "/" not in name:
                        source = tar.extractfile(member)
                        assert source is not None
                        (staged / name).write_bytes(source.read())
        shutil.rmtree(folder, ignore_errors=True)
        staged.rename(folder)
    return folder
