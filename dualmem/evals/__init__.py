"""Evals of DualMem."""
