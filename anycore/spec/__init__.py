"""Speculative decoding: draft proposers, lossless verification, per-request back-off."""
