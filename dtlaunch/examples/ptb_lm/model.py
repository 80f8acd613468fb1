"""The Zaremba et al. (2014) LSTM language model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import Config

State = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class StreamNoise:
    """Dropout masks of one training step, the same whatever the number of ranks.

    Each mask is drawn for the whole GLOBAL batch from a generator seeded by (seed, step,
    site), and each rank keeps its own streams' columns. So stream s gets the same mask with
    1 rank or 8, and a resumed run needs no random-number state: the step number is enough.
    """

    seed: int
    step: int
    streams: range  # this rank's streams
    global_batch: int

    def mask(self, site: int, shape: torch.Size, keep: float,
             device: torch.device | None = None) -> torch.Tensor:
        """On ``device``'s own generator: on a GPU, drawing on the CPU and copying would cost
        more than the step's LSTM. (So a GPU run's masks differ from a CPU run's.)"""
        key = ((self.seed * 1_000_003 + self.step) * 64 + site) % (1 << 63)
        where = device if device is not None else torch.device("cpu")
        generator = torch.Generator(device=where).manual_seed(key)
        full = torch.rand((shape[0], self.global_batch, *shape[2:]), generator=generator,
                          device=where)
        mine = full[:, self.streams.start : self.streams.stop]
        return (mine < keep).to(torch.float32) / keep


class PTBModel(nn.Module):
    """Embedding -> dropout -> LSTM layers, each followed by dropout -> softmax.

    Embedding size equals the hidden size; input and output embeddings are separate (no weight
    tying), and every parameter starts uniform in [-init_scale, init_scale], as in the TF tutorial.
    The layers are separate one-layer LSTMs (the same computation as one multi-layer LSTM with
    dropout between layers) so that every dropout mask comes from ``StreamNoise``.
    """

    def __init__(self, config: Config, sparse: bool = True) -> None:
        super().__init__()
        self.keep_prob = config.keep_prob
        self.num_layers = config.num_layers
        self.hidden_size = config.hidden_size
        # Sparse: a step touches only its batch's rows (a few hundred of 10,000), which makes
        # the backward pass, Horovod's exchange (allgather of rows) and the update cheaper.
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size, sparse=sparse)
        self.lstm = nn.ModuleList(
            nn.LSTM(config.hidden_size, config.hidden_size) for _ in range(config.num_layers)
        )
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        for param in self.parameters():
            nn.init.uniform_(param, -config.init_scale, config.init_scale)

    def initial_state(self, batch: int) -> State:
        weight = self.decoder.weight
        shape = (self.num_layers, batch, self.hidden_size)
        return weight.new_zeros(shape), weight.new_zeros(shape)

    def dropout(self, x: torch.Tensor, noise: StreamNoise | None, site: int) -> torch.Tensor:
        if not self.training or self.keep_prob >= 1.0:
            return x
        if noise is None:  # callers outside the training loop: ordinary dropout
            return F.dropout(x, 1.0 - self.keep_prob, training=True)
        return x * noise.mask(site, x.shape, self.keep_prob, x.device)

    def forward(self, inputs: torch.Tensor, state: State,
                noise: StreamNoise | None = None) -> tuple[torch.Tensor, State]:
        """``inputs`` is ``(num_steps, batch)``; returns logits ``(num_steps * batch, vocab)``."""
        x = self.dropout(self.embedding(inputs), noise, 0)
        hs, cs = [], []
        for layer, lstm in enumerate(self.lstm):
            x, (h, c) = lstm(x, (state[0][layer : layer + 1], state[1][layer : layer + 1]))
            x = self.dropout(x, noise, layer + 1)
            hs.append(h)
            cs.append(c)
        logits = self.decoder(x.reshape(-1, self.hidden_size))
        return logits, (torch.cat(hs), torch.cat(cs))
