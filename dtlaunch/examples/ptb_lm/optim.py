"""Plain SGD (no momentum, no weight decay): what the PTB model trains with, minus a cold start.

``torch.optim.SGD`` imports ``torch._dynamo`` when it is built and on its first step (its
methods are wrapped to keep the compiler out). That import costs seconds per rank, paid again
on every restart after a lost host, and the example never compiles anything. This optimizer
does the same arithmetic (``p -= lr * grad``, dense or sparse ``grad``) and calls the base
class's methods unwrapped (``functools.wraps`` keeps them as ``__wrapped__``), so a rank starts
without that import. It stays a ``torch.optim.Optimizer`` so Horovod's ``DistributedOptimizer``
can wrap it, and its ``state_dict`` has the same shape as ``torch.optim.SGD``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.optimizer import Optimizer, required


def _unwrapped(name: str) -> Callable[..., Any]:
    method: Callable[..., Any] = getattr(Optimizer, name)
    unwrapped: Callable[..., Any] = getattr(method, "__wrapped__", method)
    return unwrapped


class PlainSGD(Optimizer):
    add_param_group = _unwrapped("add_param_group")
    zero_grad = _unwrapped("zero_grad")
    state_dict = _unwrapped("state_dict")
    load_state_dict = _unwrapped("load_state_dict")

    # Horovod rebuilds the optimizer from its param_groups (which carry "lr"), so lr may be
    # absent here, as with torch.optim.SGD.
    def __init__(self, params: Iterable[Any], lr: Any = required) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
        return loss
