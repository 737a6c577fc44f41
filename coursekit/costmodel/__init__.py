"""costmodel: chapter 08's memory and time model of a training step, and a planner on top of it (P1, P8, P10).

Plain functions, each citing where its formula comes from, each checked against this course's own
measured runs and against published figures (tests/test_costmodel_*.py). What the model is asked about
is described once, in :mod:`.config`:

* memory -- :mod:`.params` (parameter counts), :mod:`.memory` (model states with ZeRO, activations after
  Korthikanti et al. 2022, pipeline in-flight micro-batches), :mod:`.gpu_memory` (:func:`memory_per_gpu`
  for a layout);
* mixture of experts -- :mod:`.experts` (the experts' parameters, the rows expert parallelism's
  all-to-alls carry, an MoE layer's activations), used by all the others when ``ModelConfig.experts > 0``;
* time -- :mod:`.compute` (FLOPs, compute time, the bubble), :mod:`.kernels` (a GPU's kernels priced by their
  shape: matmuls at their size's share of peak, memory-bound kernels by bytes), :mod:`.overhead` (a CPU's per-op cost and
  memory-bound bytes, counted from the shape), :mod:`.mfu` (FLOPs per token, MFU and HFU, and
  the usual wrong answers), :mod:`.comm` (every collective of a step, its
  bytes, and its time through chapter 01's network model), :mod:`.overlap` (what hides behind compute, derived),
  :mod:`.step` (:func:`step_time` for a layout);
* the planner -- :mod:`.planner` (:func:`evaluate` a layout, :func:`plan` the fastest that fit, checked against
  :func:`brute_force`), :mod:`.reasons` (each decision's one-line reason, from the numbers);
* how far its time can be trusted -- :mod:`.published` (torchtitan's, Llama 3's and NVIDIA's NeMo runs on H100s, predicted),
  :mod:`.ties` (the error measured against them, and the layouts of a ranking it cannot tell apart).
"""

from .config import RECOMPUTE, SCHEDULES, Hardware, Layout, ModelConfig
from .experts import (ExpertRows, check_experts, expert_collectives, expert_params, expert_rows,
                      mlp_activation_bytes, moe_activation_bytes, router_params)
from .params import ParamCount, active_params, layer_params, num_params, params_per_rank, stage_layers
from .memory import (PRECISIONS, ActivationBytes, LogitsBytes, ModelStateBytes, PipelineActivations,
                     activation_bytes_per_layer, logits_bytes, model_state_bytes, pipeline_activation_bytes)
from .gpu_memory import GPUMemory, memory_per_gpu, rank_state_bytes
from .kernels import KernelTime, kernel_time
from .compute import ComputeTime, Flops, bubble_fraction, compute_flops, compute_time
from .comm import (ATTENTIONS, AXES, OPS, Collective, PerAxis, axis_network, collective_seconds, communication_bytes,
                   communication_time, group_network, step_collectives)
from .overhead import (OPS_PER_MODULE, OPTIMIZER_OPS, OPTIMIZER_PASSES, StepOverhead, Work, ends_ops, layer_ops, mlp_work,
                       ops_of, optimizer_ops, parameter_tensors, streamed_and_accumulated,
                       transformer_overhead)
from .step import TrainingStepTime, step_time
from .mfu import (MISTAKES, Mistake, attention_flops_per_token, flops_per_token, hardware_flops_per_token, hfu,
                  matmul_params, mfu, model_flops_per_token)
from .planner import (Candidate, Space, brute_force, check_layout, evaluate, layouts, lower_bound,
                      plan, ranking_key, states_fit)
from .ties import layout_pairs, margin, model_error, pair_errors, ranking_error, ties

__all__ = ["ModelConfig", "Layout", "Hardware", "RECOMPUTE", "SCHEDULES",
           # memory
           "ParamCount", "num_params", "layer_params", "stage_layers", "params_per_rank", "active_params", "PRECISIONS",
           "ModelStateBytes", "model_state_bytes", "rank_state_bytes", "ActivationBytes", "activation_bytes_per_layer", "LogitsBytes",
           "logits_bytes", "PipelineActivations", "pipeline_activation_bytes", "GPUMemory", "memory_per_gpu",
           # time
           "Flops", "ComputeTime", "compute_flops", "compute_time", "bubble_fraction", "Collective", "PerAxis",
           "step_collectives", "communication_bytes", "axis_network", "group_network", "collective_seconds", "communication_time",
           "ATTENTIONS", "AXES", "OPS", "TrainingStepTime", "step_time", "KernelTime", "kernel_time",
           # per-op overhead and memory-bound bytes (a CPU's small ops)
           "Work", "StepOverhead", "OPS_PER_MODULE", "OPTIMIZER_OPS", "OPTIMIZER_PASSES", "ops_of", "layer_ops", "ends_ops", "optimizer_ops",
           "parameter_tensors", "streamed_and_accumulated", "transformer_overhead", "mlp_work",
           # utilisation
           "matmul_params", "attention_flops_per_token", "flops_per_token", "model_flops_per_token",
           "hardware_flops_per_token", "mfu", "hfu", "Mistake", "MISTAKES",
           # mixture of experts
           "ExpertRows", "check_experts", "expert_collectives", "expert_params", "expert_rows", "mlp_activation_bytes",
           "moe_activation_bytes", "router_params",
           # the planner
           "Candidate", "Space", "evaluate", "check_layout", "layouts", "lower_bound", "states_fit", "plan", "brute_force",
           "ranking_key",
           # how far its time can be trusted (against published runs)
           "model_error", "ranking_error", "ties", "layout_pairs", "pair_errors", "margin"]
