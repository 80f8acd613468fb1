"""Schedulers: the allocation dtlaunch runs in, where hosts come from, srun and sbatch, submit."""
