"""The MpiFamily for Open MPI: mpirun's argv, its output, its failures, its MCA settings."""
