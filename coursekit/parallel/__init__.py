"""parallel: one module per parallelism strategy; importing it registers every strategy with the loop.

``data`` (replicas, gradients averaged) and ``zero`` (ZeRO stages 1–3) so far,
and ``production`` (PyTorch's own DDP, ZeroRedundancyOptimizer and FSDP2, to
run side by side); each defines its classes and registers its
:class:`coursekit.strategy.Strategy` subclasses for :func:`coursekit.train.train`.
"""

from . import data, production, zero  # noqa: F401
from . import fsdp  # noqa: F401  (ZeRO-3 one unit at a time: "zero3_units")
from . import sharded_optimizer  # noqa: F401  (ZeRO-1 as a torch.optim.Optimizer: "sharded_optimizer")
