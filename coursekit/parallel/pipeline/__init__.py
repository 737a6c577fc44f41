"""Model and pipeline parallelism (chapters 03-04): a model's layers cut into stages, one rank each.

One module per concept, PyTorch's counterpart last:

* ``model`` -- layers cut into contiguous stages (:func:`split`, balanced by parameters or measured time)
  and the chain that runs them (``"model"``, chapter 03);
* ``comm`` -- what the stages send each other: :class:`Channel` (activations forward, gradients back),
  the tied weight's gradient summed, the loss broadcast;
* ``schedules`` -- pipeline schedules as data (GPipe, 1F1B, interleaved, ZB-H1; :class:`Schedule`);
  ``validator`` -- :func:`validate`, everything that would go wrong found before anything runs;
  ``planning`` -- :func:`plan` on a unit-time clock and the papers' formulas;
  ``measured`` -- :func:`measured_bubble`, a real step's bubble on the plan's window, its tail apart;
* ``balance`` -- unequal stages: :func:`stage_costs`, :func:`stage_times` (measured), :func:`imbalance`;
* ``traffic`` -- :func:`pipeline_traffic`, a schedule's point-to-point bytes counted from its actions;
* ``split_backward`` -- :func:`backward_input` (B) and :func:`backward_weight` (W): one backward in two pieces;
* ``core`` -- the algorithm alone, to read top to bottom: :func:`run_schedule`, one executor for any valid
  schedule, action by action;
* ``executor`` -- :func:`execute`, the core's executor measured (spans, activations kept) and the strategy
  ``"pipeline"`` (chapter 04);
* ``torch`` -- the same stages under ``torch.distributed.pipelining`` (``"torch_pipeline"``).

Every name below is importable from here (``from coursekit.parallel.pipeline import make_schedule, plan``).
P7 measured, the pipeline sweep, is an experiment: :mod:`coursekit.experiments.pipeline_sweep`.
"""

from .comm import Channel, broadcast_loss, sum_tied_gradients, tied_parameters
from .model import ModelParallel, StagedStrategy, layer_costs, layers, partition, split
from .schedules import (COMMUNICATION, COMPUTE, SCHEDULES, Action, Schedule, ScheduleError, add_communication, gpipe,
                        interleaved_1f1b, make_schedule, message, needs, one_f_one_b, zb_h1)
from .validator import run_on_clock, validate
from .planning import Plan, bubble_formula, peak_activations_formula, plan
from .measured import ACTION_NAME, MeasuredBubble, compute_op, measured_bubble
from .balance import imbalance, stage_costs, stage_times
from .traffic import PipelineTraffic, all_reduce_bytes, pipeline_traffic, pipeline_traffic_formula
from .split_backward import WeightWork, backward_input, backward_weight
from .core import Step, run_schedule
from .executor import ExecutorStats, PipelineParallel, execute
from .torch import TorchPipeline, torch_schedule

__all__ = ["layers", "layer_costs", "partition", "split", "StagedStrategy", "ModelParallel",
           "Channel", "tied_parameters", "sum_tied_gradients", "broadcast_loss",
           "COMPUTE", "COMMUNICATION", "Action", "Schedule", "ScheduleError", "gpipe", "one_f_one_b",
           "interleaved_1f1b", "zb_h1", "SCHEDULES", "make_schedule", "add_communication", "message", "needs",
           "validate", "run_on_clock", "Plan", "plan", "bubble_formula", "peak_activations_formula",
           "ACTION_NAME", "MeasuredBubble", "compute_op", "measured_bubble",
           "stage_costs", "stage_times", "imbalance",
           "PipelineTraffic", "pipeline_traffic", "pipeline_traffic_formula", "all_reduce_bytes",
           "WeightWork", "backward_input", "backward_weight",
           "run_schedule", "Step", "ExecutorStats", "execute", "PipelineParallel", "TorchPipeline", "torch_schedule"]
