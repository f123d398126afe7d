"""Slurm cluster profiles and the single-node dev cluster (``kdbench.slurm``)."""
