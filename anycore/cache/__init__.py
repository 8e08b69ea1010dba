"""KV storage: the slot pool (tensors), its free list, and the radix prefix cache."""
