"""costmodel: chapter 07's memory and time model of a training step, and a planner on top of it (P1, P8, P10).

Plain functions, each citing where its formula comes from, each checked against this course's own
measured runs and against published figures (tests/test_costmodel_*.py). What the model is asked about
is described once, in :mod:`.config`.
"""

from .config import RECOMPUTE, SCHEDULES, Hardware, Layout, ModelConfig

__all__ = ["ModelConfig", "Layout", "Hardware", "RECOMPUTE", "SCHEDULES"]
from .params import ParamCount, layer_params, num_params, params_per_rank, stage_layers  # noqa: E402
from .memory import (PRECISIONS, ActivationBytes, GPUMemory, LogitsBytes, ModelStateBytes,  # noqa: E402
                     PipelineActivations, activation_bytes_per_layer, logits_bytes, memory_per_gpu,
                     model_state_bytes, pipeline_activation_bytes)

__all__ += ["ParamCount", "num_params", "layer_params", "stage_layers", "params_per_rank",  # memory (issue 27 §1)
            "PRECISIONS", "ModelStateBytes", "model_state_bytes", "ActivationBytes", "activation_bytes_per_layer",
            "LogitsBytes", "logits_bytes", "PipelineActivations", "pipeline_activation_bytes", "GPUMemory",
            "memory_per_gpu"]
