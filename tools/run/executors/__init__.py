"""What runs a unit: the executor seam, local workers, one unit's life, Dask, SLURM."""
