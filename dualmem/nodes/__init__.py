"""Nodes of DualMem."""
