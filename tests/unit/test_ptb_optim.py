"""The example's PlainSGD: the same updates as torch.optim.SGD, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from dtlaunch.examples.ptb_lm.optim import PlainSGD  # noqa: E402


def _train(optimizer_cls: type, steps: int = 4) -> list[torch.Tensor]:
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50, 8, sparse=True)
    linear = torch.nn.Linear(8, 3)
    params = [*embedding.parameters(), *linear.parameters()]
    opt = optimizer_cls(params, lr=0.7)
    for step in range(steps):
        opt.zero_grad()
        ids = torch.tensor([step, 7, 7, 49])
        linear(embedding(ids)).pow(2).sum().backward()
        opt.step()
        for group in opt.param_groups:
            group["lr"] *= 0.5
    return [p.detach().clone() for p in params]


@pytest.mark.slow
def test_same_updates_as_torch_sgd_dense_and_sparse() -> None:
    for ours, theirs in zip(_train(PlainSGD), _train(torch.optim.SGD), strict=True):
        assert torch.equal(ours, theirs)


def test_state_dict_round_trip_and_rebuild_from_param_groups() -> None:
    model = torch.nn.Linear(2, 2)
    opt = PlainSGD(model.parameters(), lr=0.3)
    state = opt.state_dict()
    assert state["param_groups"][0]["lr"] == 0.3
    # Horovod's DistributedOptimizer rebuilds the optimizer from its param_groups alone.
    rebuilt = PlainSGD(opt.param_groups)
    rebuilt.load_state_dict(state)
    assert rebuilt.param_groups[0]["lr"] == 0.3
    with pytest.raises(ValueError):
        PlainSGD(model.parameters())  # no lr anywhere


@pytest.mark.slow
def test_building_and_stepping_does_not_import_dynamo() -> None:
    code = (
        "import sys, torch\n"
        "from dtlaunch.examples.ptb_lm.optim import PlainSGD\n"
        "m = torch.nn.Linear(2, 2); o = PlainSGD(m.parameters(), lr=1.0)\n"
        "m(torch.ones(1, 2)).sum().backward(); o.step(); o.zero_grad()\n"
        "o.load_state_dict(o.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
