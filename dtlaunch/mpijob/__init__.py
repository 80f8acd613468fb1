"""The MPI job kind: the MPI first on PATH (Open MPI's mpirun, Hydra's mpiexec) starts every
rank, its daemons over ssh or srun."""
