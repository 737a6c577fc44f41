"""What the model, pipeline and torch-pipelining tests share: one launch per world size, references first."""

import torch

import coursekit
from coursekit.train import train

STAGE_OPTIONS = ("schedule", "stages_per_rank", "partition_by", "layers_per_stage")  # what one process ignores


def _run_all(rank, world_size, strategies, configs):
    return [[train(rank, world_size, strategy, **config) for strategy in strategies] for config in configs]


def run_all(strategies: tuple[str, ...], configs: dict[int, list[dict]], timeout: float = 120.0) -> dict:
    """``{world size: (references, results)}``: ``results[rank][config][strategy]`` is ``train``'s dict.

    The one-process references run first, in this process, on one thread like each rank (two threads on a
    busy 2-core machine were 50 times slower), and before the launch, so the ranks inherit warm imports.
    """
    out, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for world_size, group in configs.items():
            single = [{k: v for k, v in c.items() if k not in STAGE_OPTIONS + ("count_traffic", "trace")}
                      for c in group]
            references = [train(0, 1, "single", **c)["records"] for c in single]
            out[world_size] = (references, coursekit.launch(_run_all, world_size, strategies, group,
                                                            timeout=timeout))
    finally:
        torch.set_num_threads(threads)
    return out
