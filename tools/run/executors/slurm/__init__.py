"""The SLURM executor."""
