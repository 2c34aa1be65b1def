"""Datasets of DualMem."""
