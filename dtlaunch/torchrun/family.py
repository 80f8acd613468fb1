"""torch.distributed as a way of starting a job (the MpiFamily seam): no MPI; dtlaunch's
fan-out starts one agent per host, as for Gloo, whose output and failures read the same. The
shown command (`dtlaunch-torch -np N -H HOSTS PROGRAM...`) names what runs."""

from __future__ import annotations

from dtlaunch.gloo.family import Gloo
from dtlaunch.mpi import HostNeeds


class TorchDistributed(Gloo):
    name = "torch.distributed"
    launcher = "dtlaunch-torch"
    prefix = "dtlaunch-torch: "
    needs = HostNeeds(mpi=False, horovod=None, option="--torch")  # the same PyTorch everywhere
    install_hint = "torch.distributed needs PyTorch (the same release) on every host"


TORCH = TorchDistributed()
