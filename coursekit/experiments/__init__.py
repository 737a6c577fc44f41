"""The course's measured experiments: runs that show a seed claim, built on the algorithms and measured from outside.

Each chapter imports its experiment from here; no algorithm imports one.

* ``pipeline_sweep`` -- P7 measured (chapter 04): 1F1B and GPipe against one process running the same
  micro-batches, for m in a list: speed-up beside the ideal, bubble beside the formula, activation bytes;
* ``data_parallel_speedup`` -- P4 measured (chapter 02): one process against 2 data-parallel ranks, waiting
  and overlapped, on a model that computes much more per byte it sends; optionally behind an emulated link;
* ``pipeline_schedules`` -- the four schedules raced on real ranks where compute dominates (chapter 04,
  section 4): measured bubble and step beside the plan, paired repeats;
* ``tensor_versus_model`` -- P10 measured (chapter 05): tensor against model parallelism on the same wide MLP;
* ``chunk_local_accuracy`` -- what attention that stays inside its chunk loses on a copy task (chapter 06);
* ``ring_overlap`` -- how much of ring attention's transfers its compute hides (chapter 06);
* ``sequence_capacity`` -- the longest sequence each attention fits in a memory budget (chapter 06);
* ``expert_balance`` -- how evenly a router spreads tokens, with no balancing, the balance loss or the bias
  nudge, and what a capacity limit drops (chapter 07; imported from there, not here);
* ``expert_imbalance`` -- an expert-parallel step's time against its routing's imbalance, 2 ranks (chapter 07);
* ``chain_cut`` -- P3 measured (chapter 03): a chain of unequal layers on 2 ranks, its idle time, and the cut by
  parameters against the cut by measured time, as a chain and as a pipeline;
* ``recompute`` -- activation recomputation (none / selective / full) on the course transformer: bytes kept per
  layer beside the cost model, the step's peak, its time, the FLOPs recomputed (issue 46).
"""

from .pipeline_sweep import (SWEEP_VARIANTS, Recomputed, SweepResult, balanced_mlp, in_flight_waits, paired,
                             pipeline_sweep, same_work_step, sweep_steps)
from .data_parallel_speedup import DP_VARIANTS, LinkedDataParallel, dp_step_times
from .pipeline_schedules import RACE_CONFIGS, RACE_LINE, RaceRow, format_race, race_steps, schedule_race
from .tensor_versus_model import VARIANTS, ResidualMLP, step_times, tensor_parallel_blocks, wide_mlp
from .chunk_local_accuracy import (EVAL_STEP, CopyData, chunk_local_losses, copy_task_losses, needs_other_chunk,
                                   per_position_loss, train_one_process)
from .ring_overlap import hidden_share, transfers_alone
from .sequence_capacity import CAPACITY_METHODS, attention_peak, block_memory, capacity_table, longest_sequence
from .chain_cut import CUT_VARIANTS, CutComparison, TokenData, chain_shares, compare_cuts, cut_steps, token_mlp
from .recompute import RecomputeRow, format_table, recompute_table, table2_share

__all__ = ["SWEEP_VARIANTS", "balanced_mlp", "Recomputed", "same_work_step", "paired", "in_flight_waits", "sweep_steps",
           "SweepResult", "pipeline_sweep",
           "DP_VARIANTS", "LinkedDataParallel", "dp_step_times",
           "RACE_CONFIGS", "RACE_LINE", "RaceRow", "race_steps", "schedule_race", "format_race",
           "VARIANTS", "ResidualMLP", "wide_mlp", "tensor_parallel_blocks", "step_times",
           "EVAL_STEP", "CopyData", "chunk_local_losses", "copy_task_losses", "needs_other_chunk", "per_position_loss",
           "train_one_process", "hidden_share", "transfers_alone",
           "CAPACITY_METHODS", "attention_peak", "block_memory", "capacity_table", "longest_sequence",
           "CUT_VARIANTS", "CutComparison", "TokenData", "chain_shares", "compare_cuts", "cut_steps", "token_mlp",
           "RecomputeRow", "recompute_table", "table2_share", "format_table"]
