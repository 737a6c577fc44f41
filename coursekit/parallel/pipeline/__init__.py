"""Model and pipeline parallelism (chapters 03-04): a model's layers cut into stages, one rank each.

One module per concept, PyTorch's counterpart last:

* ``model`` -- layers cut into contiguous stages (:func:`split`, balanced by parameters or measured time)
  and the chain that runs them (``"model"``, chapter 03);
* ``comm`` -- what the stages send each other: :class:`Channel` (activations forward, gradients back),
  the tied weight's gradient summed, the loss broadcast;
* ``schedules`` -- pipeline schedules as data (GPipe, 1F1B, interleaved, ZB-H1; :class:`Schedule`), the
  validator (:func:`validate`), the unit-time plan (:func:`plan`) and the papers' formulas;
* ``executor`` -- :func:`execute`, one executor for any valid schedule (``"pipeline"``, chapter 04);
* ``torch`` -- the same stages under ``torch.distributed.pipelining`` (``"torch_pipeline"``).

Every name below is importable from here (``from coursekit.parallel.pipeline import make_schedule, plan``).
"""

from .comm import Channel, broadcast_loss, sum_tied_gradients, tied_parameters
from .model import ModelParallel, StagedStrategy, layer_costs, layers, partition, split
from .schedules import (COMMUNICATION, COMPUTE, SCHEDULES, Action, Plan, Schedule, ScheduleError, add_communication,
                        bubble_formula, gpipe, interleaved_1f1b, make_schedule, one_f_one_b, peak_activations_formula,
                        plan, validate, zb_h1)
from .executor import ExecutorStats, PipelineParallel, execute
from .torch import TorchPipeline, torch_schedule

__all__ = ["layers", "layer_costs", "partition", "split", "StagedStrategy", "ModelParallel",
           "Channel", "tied_parameters", "sum_tied_gradients", "broadcast_loss",
           "COMPUTE", "COMMUNICATION", "Action", "Schedule", "ScheduleError", "gpipe", "one_f_one_b",
           "interleaved_1f1b", "zb_h1", "SCHEDULES", "make_schedule", "add_communication",
           "validate", "Plan", "plan", "bubble_formula", "peak_activations_formula",
           "ExecutorStats", "execute", "PipelineParallel", "TorchPipeline", "torch_schedule"]
