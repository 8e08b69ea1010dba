"""Shared building blocks of decoder models; model files compose these."""
