"""Counting the reads of a tensor's value from its device (tests of training loops that must not read per step)."""

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class DeviceReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` calls (``.item()``, ``float(t)``, ``bool(t)``: on a GPU each a host
    synchronisation) made inside the ``with`` block. Not counted: ``torch.optim``'s reads of its step counts, which
    it keeps on the host whatever the model's device."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and not any(
                "torch/optim/" in frame.filename.replace("\\", "/") for frame in traceback.extract_stack()):
            self.count += 1
        return func(*args, **(kwargs or {}))
