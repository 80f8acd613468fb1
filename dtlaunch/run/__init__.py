"""A run: the library call, its execution and output, the restart loop and policy, the Slurm node
watch.

See docs/architecture.md."""
