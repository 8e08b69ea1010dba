"""Kernel ops: the op table (ops.py), torch-native fallbacks, the C++ extension and dispatch."""
