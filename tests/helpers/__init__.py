"""Helpers shared by test modules (no tests here: test modules never import each other)."""
