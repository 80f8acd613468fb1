"""dtlaunch: launch Horovod training jobs over Open MPI, checked before they start."""

__version__ = "0.1.0"
