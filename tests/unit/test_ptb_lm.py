"""Tests of the bundled PTB language model example (dtlaunch.examples.ptb_lm)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.ptb import HAVE_PTB, PTB_DIR, REPO, mpirun_command, needs_ptb
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.examples.ptb_lm import comm, data, train
from dtlaunch.examples.ptb_lm.comm import SingleProcess
from dtlaunch.examples.ptb_lm.config import CONFIGS, LARGE, MEDIUM, SMALL, Config, learning_rate
from dtlaunch.examples.ptb_lm.model import PTBModel


def run_module(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [sys.executable, "-m", "dtlaunch.examples.ptb_lm", *args],
        capture_output=True, text=True, timeout=timeout, env=environ, cwd=REPO,
    )


# ---------------------------------------------------------------- configuration


def test_configs_match_zaremba() -> None:
    expected = {  # init, lr, clip, layers, steps, hidden, max_epoch, epochs, keep, decay, batch
        "small": (0.1, 1.0, 5, 2, 20, 200, 4, 13, 1.0, 0.5, 20),
        "medium": (0.05, 1.0, 5, 2, 35, 650, 6, 39, 0.5, 0.8, 20),
        "large": (0.04, 1.0, 10, 2, 35, 1500, 14, 55, 0.35, 1 / 1.15, 20),
    }
    for name, values in expected.items():
        c = CONFIGS[name]
        actual = (c.init_scale, c.learning_rate, c.max_grad_norm, c.num_layers, c.num_steps,
                  c.hidden_size, c.max_epoch, c.max_max_epoch, c.keep_prob, c.lr_decay,
                  c.batch_size)
        assert actual == values
        assert c.vocab_size == 10000
    with pytest.raises(AttributeError):
        SMALL.batch_size = 10  # type: ignore[misc]


def test_learning_rate_schedule() -> None:
    small = [learning_rate(SMALL, i) for i in range(SMALL.max_max_epoch)]
    assert small[:4] == [1.0] * 4
    assert small[4:7] == [0.5, 0.25, 0.125]
    assert small[-1] == pytest.approx(0.5**9)
    assert [learning_rate(MEDIUM, i) for i in (5, 6, 7)] == pytest.approx([1.0, 0.8, 0.64])
    assert learning_rate(LARGE, 13) == 1.0
    assert learning_rate(LARGE, 54) == pytest.approx(1.15**-41)


# ---------------------------------------------------------------- data


@pytest.fixture(scope="module")
def corpus() -> data.Corpus:
    if not HAVE_PTB:
        pytest.skip(f"PTB files not found in {PTB_DIR}")
    return data.load_corpus(PTB_DIR)


def test_token_ids_cache_round_trip_and_corrupt_file(
    corpus: data.Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = data.load_corpus(PTB_DIR)  # builds and writes the cache
    (cached,) = data.ids_cache_dir().glob("*.npz")
    assert oct(cached.parent.stat().st_mode & 0o777) == "0o700"
    again = data.load_corpus(PTB_DIR)  # reads it
    for got in (first, again):
        assert got.words == corpus.words
        for split in data.SPLITS:
            assert np.array_equal(getattr(got, split), getattr(corpus, split))
    cached.write_bytes(b"not an npz file")
    assert data.load_corpus(PTB_DIR).words == corpus.words  # ignored and rebuilt
    assert data._cached_corpus(cached) is not None  # and rewritten


class _Recording(SingleProcess):
    """Rank 0 of a world whose broadcasts are recorded (sizes of what each call carries)."""

    def __init__(self) -> None:
        self.objects: list[int] = []
        self.tensors: list[int] = []

    def broadcast_object(self, obj: object, root_rank: int = 0, name: object = None) -> object:
        import pickle
        self.objects.append(len(pickle.dumps(obj)))
        return obj

    def broadcast_(self, tensor: torch.Tensor, root_rank: int, name: object = None) -> torch.Tensor:
        self.tensors.append(tensor.numel() * tensor.element_size())
        return tensor


@needs_ptb
def test_the_corpus_travels_as_tensors_not_as_one_pickle(corpus: data.Corpus) -> None:
    # broadcast_object copies its pickle into a tensor byte by byte in Python: 1-4 s of every
    # (re)start for the 8 MB of ids. Only the vocabulary and the lengths go that way now.
    comm = _Recording()
    got = train.shared_corpus(comm, str(PTB_DIR))
    assert got.words == corpus.words
    for split in data.SPLITS:
        assert np.array_equal(getattr(got, split), getattr(corpus, split))
    assert max(comm.objects) < 200_000
    assert sum(comm.tensors) == 8 * sum(len(getattr(corpus, s)) for s in data.SPLITS)


def test_vocab_and_word_counts(corpus: data.Corpus) -> None:
    assert len(corpus.words) == 10000
    assert "<eos>" in corpus.words and "<unk>" in corpus.words
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (929589, 73760, 82430)
    eos = corpus.words.index("<eos>")
    assert int((corpus.train == eos).sum()) == 42068  # one per line
    assert corpus.train.max() == 9999 and corpus.train.min() == 0


@given(st.integers(1, 64), st.integers(1, 80))
def test_sharding_uses_every_stream_once(batch: int, size: int) -> None:
    if size > batch:
        with pytest.raises(data.DataError, match="at most"):
            data.shard_range(batch, 0, size)
        return
    shares = [data.shard_range(batch, r, size) for r in range(size)]
    assert [s for share in shares for s in share] == list(range(batch))
    lengths = [len(share) for share in shares]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


def test_stream_matrix_layout() -> None:
    ids = np.arange(23)
    m = data.stream_matrix(ids, 4)  # 5 tokens per stream, 3 dropped
    assert m.shape == (5, 4)
    assert m[:, 1].tolist() == [5, 6, 7, 8, 9]


@given(st.integers(2, 300), st.integers(1, 12))
def test_eval_streams_cover_every_target_once(n: int, streams: int) -> None:
    ids = np.arange(n) + 1000
    inputs, targets = data.eval_streams(ids, streams)
    real = targets != data.IGNORE_INDEX
    assert sorted(targets[real].tolist()) == list(range(1001, 1000 + n))
    assert (inputs[real] == targets[real] - 1).all()  # each target reads its predecessor


def test_evaluate_matches_direct_computation() -> None:
    cfg = Config("tiny", 0.1, 1.0, 5, 2, 4, 8, 1, 1, 1.0, 1.0, 2, 30)
    torch.manual_seed(0)
    model = PTBModel(cfg)
    ids = np.random.default_rng(0).integers(0, 30, 57)
    job = train.Job(comm=SingleProcess(), config=cfg, model=model, optimizer=None,  # type: ignore[arg-type]
                    train=torch.zeros(1, 1), streams=range(0), loss_scale=1.0,
                    report=train.Reporter(False, None))
    with torch.no_grad():
        x = torch.from_numpy(ids[:-1]).unsqueeze(1)
        logits, _ = model(x, model.initial_state(1))
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(ids[1:]))
    assert train.evaluate(job, ids, 1) == pytest.approx(math.exp(loss.item()), rel=1e-5)


def copy_ptb(dst: Path, with_sums: bool = True) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in data.FILES.values():
        shutil.copy(PTB_DIR / name, dst / name)
    if with_sums:
        shutil.copy(PTB_DIR / "SHA256SUMS", dst / "SHA256SUMS")
    return dst


@needs_ptb
@pytest.mark.parametrize("with_sums", [True, False])
def test_corrupt_file_is_rejected(tmp_path: Path, with_sums: bool) -> None:
    d = copy_ptb(tmp_path / "ptb", with_sums)
    raw = bytearray((d / "ptb.valid.txt").read_bytes())
    raw[1000] ^= 0x01
    (d / "ptb.valid.txt").write_bytes(bytes(raw))
    with pytest.raises(data.DataError, match=r"ptb\.valid\.txt .*corrupt or truncated"):
        data.load_corpus(d)


@needs_ptb
def test_truncated_file_exits_2_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = copy_ptb(tmp_path / "ptb", with_sums=False)
    (d / "ptb.test.txt").write_bytes((d / "ptb.test.txt").read_bytes()[:-100])
    monkeypatch.setattr(train, "get_comm", lambda nice: SingleProcess())
    assert train.main(["--data-path", str(d), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ptb.test.txt" in err and "corrupt or truncated" in err


def test_offline_download_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(data.URL_ENV, "http://127.0.0.1:9/simple-examples.tgz")
    monkeypatch.setattr(train, "get_comm", lambda nice: SingleProcess())
    target = tmp_path / "nothing-here"
    assert train.main(["--data-path", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "cannot download http://127.0.0.1:9/" in err and f"into {target}" in err
    assert not any(target.glob("*")) if target.exists() else True


def fake_archive(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_download_reads_only_wanted_members(tmp_path: Path) -> None:
    texts = {name: f" a b {name} \n c <unk> \n".encode() for name in data.FILES.values()}
    members = {f"./simple-examples/data/{n}": t for n, t in texts.items()}
    members["../escape.txt"] = b"outside"
    members["simple-examples/data/../../escape2.txt"] = b"outside"
    archive = tmp_path / "simple-examples.tgz"
    archive.write_bytes(fake_archive(members))
    d = tmp_path / "dl" / "ptb"
    d.mkdir(parents=True)
    (d / "SHA256SUMS").write_text(
        "".join(f"{hashlib.sha256(t).hexdigest()}  {n}\n" for n, t in texts.items()))
    corpus = data.load_corpus(d, url=archive.as_uri())
    assert len(corpus.train) == 7
    assert sorted(p.name for p in d.iterdir()) == sorted([*texts, "SHA256SUMS"])
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "dl" / "escape.txt").exists()


def test_download_with_wrong_checksum_writes_nothing(tmp_path: Path) -> None:
    members = {f"simple-examples/data/{n}": b" x \n" for n in data.FILES.values()}
    archive = tmp_path / "a.tgz"
    archive.write_bytes(fake_archive(members))
    d = tmp_path / "ptb"
    with pytest.raises(data.DataError, match="corrupt or truncated"):
        data.load_corpus(d, url=archive.as_uri())  # pinned checksums do not match
    assert not d.exists() or not any(d.iterdir())


# ---------------------------------------------------------------- training runs


def read_metrics(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@needs_ptb
def test_single_process_training_reduces_loss(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    ckpt = tmp_path / "ckpt.pt"
    result = run_module("--data-path", str(PTB_DIR), "--max-steps", "30", "--log-interval", "10",
                        "--no-eval", "--metrics", str(metrics), "--checkpoint", str(ckpt))
    assert result.returncode == 0, result.stderr
    ppl = [r["train_ppl"] for r in read_metrics(metrics) if r["event"] == "progress"]
    assert len(ppl) == 3 and ppl[0] > ppl[-1]  # type: ignore[operator]
    assert ppl[-1] < 1500  # type: ignore[operator]
    state = torch.load(ckpt, weights_only=True)
    assert state["config"]["name"] == "small" and state["ranks"] == 1
    assert (state["position"]["epoch"], state["position"]["step"]) == (0, 30)
    resumed = run_module("--data-path", str(PTB_DIR), "--max-steps", "31", "--no-eval",
                         "--checkpoint", str(ckpt), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "steps 31 " in resumed.stdout


@needs_ptb
def test_unreadable_checkpoint_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"not a checkpoint")
    monkeypatch.setattr(train, "get_comm", lambda nice: SingleProcess())
    args = ["--data-path", str(PTB_DIR), "--checkpoint", str(ckpt), "--resume", "--no-eval"]
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot resume from" in err


@pytest.mark.slow
@pytest.mark.horovod
@needs_ptb
@pytest.mark.usefixtures("horovod")
def test_unequal_shares_give_the_single_process_update(tmp_path: Path) -> None:
    """Global batch 5 over 2 ranks (2 + 3 streams) must train like one process on 5 streams."""
    common = ["--data-path", str(PTB_DIR), "--max-steps", "5", "--no-eval", "--batch-size", "5",
              "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    multi = subprocess.run([*mpirun_command(2), *common, "--dump-params", str(tmp_path / "m")],
                           capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert multi.returncode == 0, multi.stdout + multi.stderr
    single = run_module(*common, "--dump-params", str(tmp_path / "s"))
    assert single.returncode == 0, single.stderr
    m = torch.load(tmp_path / "m.rank0.pt")
    s = torch.load(tmp_path / "s.rank0.pt")
    assert (m - s).abs().max().item() < 1e-5


def test_threads_started_by_the_communication_init_are_lowered_and_no_other() -> None:
    release = threading.Event()
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    before = comm.thread_ids()
    worker = threading.Thread(target=release.wait)  # stands in for Horovod's background loop
    worker.start()
    try:
        lowered = comm.lower_priority(comm.thread_ids() - before, 19)
        assert lowered == [worker.native_id]
        assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == 19
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
        assert comm.lower_priority({worker.native_id}, 0) == []  # 0 leaves them as they are
    finally:
        release.set()
        worker.join()
    # join() returns before the kernel thread has quite gone: wait for it (bounded), then a
    # thread that is gone is skipped.
    deadline = time.monotonic() + 10
    while worker.native_id in comm.thread_ids() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert comm.lower_priority({worker.native_id}, 19) == []
