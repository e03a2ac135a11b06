"""Helpers for scripts/bench.py: one module per benchmark, plus the programs the ranks run."""
