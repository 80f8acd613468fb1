"""The MpiFamily for MPICH and Intel MPI: Hydra's mpiexec, its ssh agent, output and failures."""
