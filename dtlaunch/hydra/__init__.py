"""The MpiFamily for MPICH and Intel MPI: Hydra's mpiexec, its ssh agent, its output and
failures.

See docs/architecture.md."""
