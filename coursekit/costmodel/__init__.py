"""costmodel: chapter 07's memory and time model of a training step, and a planner on top of it (P1, P8, P10).

Plain functions, each citing where its formula comes from, each checked against this course's own
measured runs and against published figures (tests/test_costmodel_*.py). What the model is asked about
is described once, in :mod:`.config`.
"""

from .config import RECOMPUTE, SCHEDULES, Hardware, Layout, ModelConfig

__all__ = ["ModelConfig", "Layout", "Hardware", "RECOMPUTE", "SCHEDULES"]
from .comm import (ATTENTIONS, AXES, OPS, Collective, PerAxis, axis_network, collective_seconds, communication_bytes,
                   communication_time, step_collectives)
from .compute import ComputeTime, Flops, bubble_fraction, compute_flops, compute_time
from .step import TrainingStepTime, step_time

__all__ += ["Collective", "PerAxis", "step_collectives", "communication_bytes", "axis_network", "collective_seconds",
            "communication_time", "ATTENTIONS", "AXES", "OPS", "Flops", "ComputeTime", "compute_flops", "compute_time",
            "bubble_fraction", "TrainingStepTime", "step_time"]
