"""Tensor parallel on ``torch.distributed`` (gloo): the group (group.py), rank 0's driver
(driver.py), the worker ranks (worker.py) and the extra nodes' launcher (node.py). The sharded
layers live in anycore/layers/parallel.py."""
