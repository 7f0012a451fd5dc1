"""Kernel backends for the memory's passes."""
