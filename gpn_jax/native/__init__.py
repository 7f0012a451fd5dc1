"""Compiled CPU kernels that XLA's own code generation runs slower, each with its reason and its
measurement in its module: built on first use with the system's C++ compiler, cached per CPU,
and replaced by XLA's operations wherever they cannot be built or are not wanted.

`small_matmul`: the fused window's per-token products (few rows, a weight matrix packed once).
"""
