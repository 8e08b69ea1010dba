"""Continuous batching: which requests' tokens run in the next step."""
