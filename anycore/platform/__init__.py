"""CPU feature detection and the kernel backend-selection table."""
