"""The Zaremba et al. (2014) LSTM language model."""

from __future__ import annotations

import torch
from torch import nn

from .config import Config

State = tuple[torch.Tensor, torch.Tensor]


class PTBModel(nn.Module):
    """Embedding -> dropout -> multi-layer LSTM (dropout between layers) -> dropout -> softmax.

    Embedding size equals the hidden size; input and output embeddings are separate (no weight
    tying), and every parameter starts uniform in [-init_scale, init_scale], as in the TF tutorial.
    """

    def __init__(self, config: Config, sparse: bool = True) -> None:
        super().__init__()
        dropout = 1.0 - config.keep_prob
        self.num_layers = config.num_layers
        self.hidden_size = config.hidden_size
        # Sparse: a step touches only its batch's rows (a few hundred of 10,000), which makes
        # the backward pass, Horovod's exchange (allgather of rows) and the update cheaper.
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size, sparse=sparse)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            config.hidden_size,
            config.hidden_size,
            num_layers=config.num_layers,
            dropout=dropout if config.num_layers > 1 else 0.0,
        )
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        for param in self.parameters():
            nn.init.uniform_(param, -config.init_scale, config.init_scale)

    def initial_state(self, batch: int) -> State:
        weight = self.decoder.weight
        shape = (self.num_layers, batch, self.hidden_size)
        return weight.new_zeros(shape), weight.new_zeros(shape)

    def forward(self, inputs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """``inputs`` is ``(num_steps, batch)``; returns logits ``(num_steps * batch, vocab)``."""
        embedded = self.drop(self.embedding(inputs))
        output, state = self.lstm(embedded, state)
        logits = self.decoder(self.drop(output).reshape(-1, self.hidden_size))
        return logits, state
