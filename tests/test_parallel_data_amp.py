"""Mixed precision for plain data parallelism, as DDP is used with it: the forward under ``torch.autocast``.

``train(..., "naive" | "bucketed" | "sharded_optimizer" | "torch_ddp", precision="bf16")``: fp32 parameters (the
master weights), bf16 matmuls, fp32 gradients all-reduced in fp32. Checked against a one-process reference written
here (the same model and batch under ``torch.autocast``), against DDP under autocast, and against fp32 (so that
bf16 is seen to be on).

Tolerances are bf16's. Two half-batches in bf16 round differently from one whole batch: measured here, the
step-0 gradients of 2 and 3 ranks differ from one process's bf16 gradients by 0.24% and 0.68% (per-tensor norm),
as much as bf16 differs from fp32 (0.70%); fp32 runs differ by 2.4e-07.

Planted bugs, seen failing:
* the forward not under autocast -> "bf16 is on" fails (the gradients are fp32's to 1e-7);
* autocast's output left in bf16 for the loss (DDP's is cast to fp32) -> the equality with DDP under autocast;
* fp16 accepted (no loss scale in the loop's backward) -> the refusal test.
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.train import train

BATCH = 7
STRATEGIES = ("naive", "bucketed", "sharded_optimizer", "torch_ddp")


def _relative(got: dict, want: dict) -> float:
    return max(((got[n] - want[n]).norm() / want[n].norm()).item() for n in want)


def _one_process(bf16: bool) -> dict:
    model = tiny_transformer(seed=0)
    x, y = LanguageData(seed=0).batch(0, BATCH)
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x).float()
    else:
        out = model(x)
    loss_fn(out, y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _step0(rank, world_size):
    """Every strategy's step-0 gradients in bf16, on one set of ranks (one launch per world size)."""
    import warnings
    warnings.filterwarnings("ignore", message="Full backward hook")
    return {s: train(rank, world_size, s, model="transformer", steps=1, global_batch=BATCH,
                     precision="bf16")["records"][0]["grads"] for s in STRATEGIES}


@pytest.fixture(scope="module")
def references():
    return _one_process(bf16=True), _one_process(bf16=False)


@pytest.fixture(scope="module")
def runs():
    return {world_size: coursekit.launch(_step0, world_size, timeout=300)[0] for world_size in (2, 3)}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_data_parallelism_is_one_process_under_autocast(references, runs, strategy, world_size):
    bf16, fp32 = references
    grads = runs[world_size][strategy]
    assert _relative(grads, bf16) < 0.02, f"{strategy}: {_relative(grads, bf16):.2%} from one process's bf16"
    assert _relative(grads, fp32) > 1e-4, f"{strategy}: bf16 is not on (the gradients are fp32's)"


@pytest.mark.parametrize("world_size", [2, 3])
def test_ours_equal_ddp_under_autocast(runs, world_size):
    """The course's data parallelism and DDP, both under autocast: the same gradients to fp32's rounding."""
    ddp = runs[world_size]["torch_ddp"]
    for strategy in ("naive", "bucketed", "sharded_optimizer"):
        assert _relative(runs[world_size][strategy], ddp) < 1e-5, (strategy, _relative(runs[world_size][strategy], ddp))


@pytest.mark.parametrize("precision, words", [("fp16", "only 'bf16'"), ("bf16-reduce-bf16", "only 'bf16'")])
@pytest.mark.parametrize("strategy", ["naive", "bucketed"])
def test_what_plain_data_parallelism_cannot_do_is_refused(strategy, precision, words):
    with pytest.raises(ValueError, match=words):
        train(0, 1, strategy, model="transformer", steps=1, precision=precision)
