"""The WGSL kernels, shipped as package data (this file only makes the folder importable for importlib.resources)."""
