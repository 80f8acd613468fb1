"""One training run's parts (Job) and its reporter: what train.py builds and checkpoint.py saves.

Apart from both, so that neither imports the other.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import torch

from .config import Config
from .model import PTBModel

CPU = torch.device("cpu")


def columns(matrix: np.ndarray, streams: range, device: torch.device) -> torch.Tensor:
    """The columns ``streams`` of a ``(length, streams)`` matrix, as a tensor on ``device``."""
    return torch.from_numpy(np.ascontiguousarray(matrix[:, streams.start : streams.stop])).to(device)


@dataclass
class Job:
    """Everything one training run needs, built once."""

    comm: Any
    config: Config
    model: PTBModel
    optimizer: torch.optim.Optimizer
    train: torch.Tensor  # (stream_len, local streams)
    streams: range
    loss_scale: float
    report: Reporter
    seed: int = 0
    # What a training step calls: the model itself, or DDP's wrapper (--backend ddp).
    net: torch.nn.Module | None = None
    device: torch.device = CPU


class Reporter:
    """Prints on rank 0 and appends JSON lines to ``--metrics``."""

    def __init__(self, active: bool, metrics: str | None) -> None:
        self.active = active
        self.file: IO[str] | None = None
        if active and metrics:
            self.file = open(metrics, "a", encoding="utf-8")  # noqa: SIM115

    def emit(self, text: str, record: dict[str, Any]) -> None:
        if not self.active:
            return
        print(text, flush=True)
        if self.file:
            clean = {k: None if isinstance(v, float) and math.isnan(v) else v
                     for k, v in record.items()}  # NaN is not valid JSON
            clean.setdefault("time", time.time())  # lines up with the launcher's timestamps
            self.file.write(json.dumps(clean) + "\n")
            self.file.flush()
