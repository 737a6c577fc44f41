"""The capstone: one trainer for every layout, started by ``torchrun`` or from a notebook.

* ``run`` -- :class:`Config` (the layout, the model, the steps) and :func:`run`, what each rank executes:
  one mesh, the composed strategy (:mod:`coursekit.parallel.hybrid`), the one training loop;
* ``experts`` -- ``--experts E --ep N``: the transformer with MoE blocks on chapter 07's ``"expert"`` strategy,
  its experts over ``ep`` of the ``dp`` ranks; what it refuses, and its one-process curve;
* ``checkpoint`` -- checkpoints that reshard: each rank's tensors described as DTensors, saved and loaded by
  ``torch.distributed.checkpoint``, so a run saved under one layout resumes under another; never torn;
* ``__main__`` -- the command line, ``coursekit train`` / ``python -m coursekit.capstone``, under ``torchrun``
  (env rendezvous) or on its own (it launches the ranks).
"""

from .run import Config, check, one_process_losses, run

__all__ = ["Config", "check", "run", "one_process_losses"]
