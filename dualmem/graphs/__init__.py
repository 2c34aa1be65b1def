"""Graphs of DualMem."""
