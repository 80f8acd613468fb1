"""Zaremba et al. (2014) PTB configurations, as used by the TensorFlow tutorial and Texar."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """Hyper-parameters of one PTB setting. ``batch_size`` is the GLOBAL batch (all ranks)."""

    name: str
    init_scale: float
    learning_rate: float
    max_grad_norm: float
    num_layers: int
    num_steps: int
    hidden_size: int
    max_epoch: int
    max_max_epoch: int
    keep_prob: float
    lr_decay: float
    batch_size: int
    vocab_size: int


SMALL = Config(
    name="small", init_scale=0.1, learning_rate=1.0, max_grad_norm=5.0, num_layers=2,
    num_steps=20, hidden_size=200, max_epoch=4, max_max_epoch=13, keep_prob=1.0,
    lr_decay=0.5, batch_size=20, vocab_size=10000,
)
MEDIUM = Config(
    name="medium", init_scale=0.05, learning_rate=1.0, max_grad_norm=5.0, num_layers=2,
    num_steps=35, hidden_size=650, max_epoch=6, max_max_epoch=39, keep_prob=0.5,
    lr_decay=0.8, batch_size=20, vocab_size=10000,
)
LARGE = Config(
    name="large", init_scale=0.04, learning_rate=1.0, max_grad_norm=10.0, num_layers=2,
    num_steps=35, hidden_size=1500, max_epoch=14, max_max_epoch=55, keep_prob=0.35,
    lr_decay=1 / 1.15, batch_size=20, vocab_size=10000,
)

CONFIGS: dict[str, Config] = {c.name: c for c in (SMALL, MEDIUM, LARGE)}


def learning_rate(config: Config, epoch: int) -> float:
    """Learning rate for 0-based ``epoch``: constant for ``max_epoch`` epochs, then decayed."""
    return config.learning_rate * config.lr_decay ** max(epoch + 1 - config.max_epoch, 0)
