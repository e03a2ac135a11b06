"""bootstrap: writes the sbatch script that runs `python -m agent` on every node."""
