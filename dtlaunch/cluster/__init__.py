"""Schedulers: the allocation dtlaunch runs in, where the hosts come from, srun and sbatch lines,
submit.

See docs/architecture.md."""
