"""horovodrun's options, knobs and config file, and building Horovod for the MPI at hand."""
