"""Penn Treebank reading, integrity checks, download, and the stream layout used for training.

Layout (as in the TensorFlow tutorial): the token sequence of a split is cut into ``batch_size``
equally long contiguous streams; a training step reads the next ``num_steps`` tokens of every
stream, so the LSTM state can be carried from one step to the next.

Sharding rule: ``batch_size`` is the GLOBAL number of streams. Rank ``r`` of ``size`` takes the
contiguous streams ``[r * B // size, (r + 1) * B // size)``: shares differ by at most one stream,
every stream is used by exactly one rank, and none is dropped. More ranks than streams is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

SPLITS = ("train", "valid", "test")
FILES = {split: f"ptb.{split}.txt" for split in SPLITS}
EOS = "<eos>"
DEFAULT_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
URL_ENV = "DTLAUNCH_PTB_URL"  # lets tests and mirrors point the download elsewhere
DOWNLOAD_TIMEOUT_S = 60.0
IGNORE_INDEX = -100  # target value for padding; skipped by cross_entropy

# Used when the data directory has no SHA256SUMS file.
PINNED_SHA256 = {
    "ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}


class DataError(Exception):
    """A data problem the user must fix; the message is one line and says how."""


@dataclass
class Corpus:
    """Token ids of the three splits (int64) and the vocabulary (index = id)."""

    words: list[str]
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray


# ---------------------------------------------------------------- integrity and download


def expected_sha256(data_dir: Path) -> dict[str, str]:
    """Checksums from ``data_dir/SHA256SUMS`` where it lists a file, else the pinned ones."""
    expected = dict(PINNED_SHA256)
    sums = data_dir / "SHA256SUMS"
    if sums.is_file():
        for line in sums.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") in expected:
                expected[parts[1].lstrip("*")] = parts[0].lower()
    return expected


def check_sha256(name: str, content: bytes, expected: str, where: str) -> None:
    actual = hashlib.sha256(content).hexdigest()
    if actual != expected:
        raise DataError(
            f"{name} from {where} is corrupt or truncated (sha256 {actual[:12]}..., expected "
            f"{expected[:12]}...); replace it with a good copy (delete it to re-download)"
        )


def members_from_archive(archive: bytes, names: list[str]) -> dict[str, bytes]:
    """Read the wanted ``simple-examples/data/<name>`` members; nothing is written by tarfile,
    so names with ``..`` or absolute paths in the archive cannot escape the data directory."""
    wanted = {f"simple-examples/data/{name}": name for name in names}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for member in tar:
                path = member.name
                while path.startswith("./"):
                    path = path[2:]
                if path in wanted and member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found[wanted[path]] = handle.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"downloaded archive is unreadable ({exc})") from None
    missing = sorted(set(names) - set(found))
    if missing:
        raise DataError(f"downloaded archive lacks {', '.join(missing)}")
    return found


def write_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """``write(handle)`` into a temporary file beside ``path``, flushed and fsynced, then renamed
    over it (and the directory fsynced): a crash leaves the old file or the new, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(handle.fileno(), 0o666 & ~umask)  # as open() would; mkstemp gives 0600
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def read_verified(data_dir: Path, url: str | None = None) -> dict[str, bytes]:
    """Bytes of the three files, checksum-verified; absent files are downloaded first."""
    expected = expected_sha256(data_dir)
    contents: dict[str, bytes] = {}
    for name in FILES.values():
        if (data_dir / name).is_file():
            contents[name] = (data_dir / name).read_bytes()
            check_sha256(name, contents[name], expected[name], str(data_dir))
    missing = [name for name in FILES.values() if name not in contents]
    if not missing:
        return contents
    url = url or os.environ.get(URL_ENV) or DEFAULT_URL
    hint = (
        f"copy {', '.join(FILES.values())} (from simple-examples.tgz, simple-examples/data/) "
        f"into {data_dir}"
    )
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            downloaded = members_from_archive(bytes(response.read()), missing)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DataError(f"PTB files missing in {data_dir} and cannot download {url} "
                        f"({getattr(exc, 'reason', exc)}); {hint}") from None
    except DataError as exc:
        raise DataError(f"PTB files missing in {data_dir} and {exc}; {hint}") from None
    for name, content in downloaded.items():
        check_sha256(name, content, expected[name], url)
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, content in downloaded.items():
        # The writer runs before the loop moves on, so binding ``content`` late is safe.
        write_atomically(data_dir / name, lambda handle: handle.write(content))  # noqa: B023
    return {**contents, **downloaded}


# ---------------------------------------------------------------- vocabulary and ids


def build_corpus(contents: dict[str, bytes]) -> Corpus:
    """Words with one ``<eos>`` per line; the vocabulary by descending frequency in the
    training split, ties alphabetical (the TensorFlow tutorial's order)."""
    tokens = {s: contents[FILES[s]].decode("utf-8").replace("\n", f" {EOS} ").split()
              for s in SPLITS}
    counts = Counter(tokens["train"])
    words = sorted(counts, key=lambda w: (-counts[w], w))
    index = {w: i for i, w in enumerate(words)}
    unk = index.get("<unk>", 0)
    ids = {s: np.fromiter((index.get(w, unk) for w in tokens[s]), dtype=np.int64,
                          count=len(tokens[s])) for s in SPLITS}
    return Corpus(words=words, **ids)


def ids_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dtlaunch" / "ptb-ids"


def _cached_corpus(path: Path) -> Corpus | None:
    try:
        with np.load(path, allow_pickle=False) as saved:
            return Corpus(words=[str(w) for w in saved["words"]], train=saved["train"],
                          valid=saved["valid"], test=saved["test"])
    except (OSError, KeyError, ValueError):
        return None


def _save_corpus(path: Path, corpus: Corpus) -> None:
    """Best effort: a cache that cannot be written only costs the next start a second."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, lambda out: np.savez(
            out, words=np.array(corpus.words), train=corpus.train, valid=corpus.valid,
            test=corpus.test))


def load_corpus(data_dir: str | Path, url: str | None = None) -> Corpus:
    """The corpus as token ids. Tokenizing takes about a second, paid on every (re)start, so
    the ids are cached under the user's cache directory, keyed by the files' exact bytes."""
    contents = read_verified(Path(data_dir), url)
    digest = hashlib.sha256(b"".join(contents[FILES[s]] for s in SPLITS)).hexdigest()[:32]
    path = ids_cache_dir() / f"{digest}.npz"
    corpus = _cached_corpus(path)
    if corpus is None:
        corpus = build_corpus(contents)
        _save_corpus(path, corpus)
    return corpus


# ---------------------------------------------------------------- streams and sharding


def shard_range(num_streams: int, rank: int, size: int, allow_empty: bool = False) -> range:
    """Contiguous near-equal share of ``num_streams`` streams for ``rank`` (see module doc)."""
    if size > num_streams and not allow_empty:
        raise DataError(
            f"cannot split a global batch of {num_streams} streams over {size} ranks; "
            f"use at most {num_streams} ranks or a larger --batch-size"
        )
    return range(rank * num_streams // size, (rank + 1) * num_streams // size)


def stream_matrix(ids: np.ndarray, num_streams: int) -> np.ndarray:
    """``(stream_len, num_streams)`` matrix, column s = stream s; the tail that does not fill
    a whole row is dropped (at most ``num_streams - 1`` tokens, as in the tutorial)."""
    stream_len = len(ids) // num_streams
    return ids[: stream_len * num_streams].reshape(num_streams, stream_len).T.copy()


def eval_streams(ids: np.ndarray, num_streams: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets ``(length, num_streams)`` covering EVERY target of the split once.

    Targets 1..N-1 are cut into ``num_streams`` contiguous pieces of near-equal length; a piece
    starting at target t reads input t-1. Shorter pieces are padded at the end with
    ``IGNORE_INDEX`` targets, which (the LSTM being causal) do not affect real predictions.
    """
    n_targets = len(ids) - 1
    bounds = [1 + s * n_targets // num_streams for s in range(num_streams + 1)]
    length = max(bounds[s + 1] - bounds[s] for s in range(num_streams))
    inputs = np.zeros((length, num_streams), dtype=np.int64)
    targets = np.full((length, num_streams), IGNORE_INDEX, dtype=np.int64)
    for s in range(num_streams):
        lo, hi = bounds[s], bounds[s + 1]
        inputs[: hi - lo, s] = ids[lo - 1 : hi - 1]
        targets[: hi - lo, s] = ids[lo:hi]
    return inputs, targets
