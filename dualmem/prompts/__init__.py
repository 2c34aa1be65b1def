"""Prompts of DualMem."""
