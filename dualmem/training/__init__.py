"""Training of DualMem."""
