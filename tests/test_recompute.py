"""Activation recomputation on the course transformer (issue 46, item 4): numerics, bytes, FLOPs.

``apply_recompute(model, policy)`` (coursekit.parallel.recompute) against the cost model's ``recompute`` option
and hand-derived FLOPs; the measured table itself is coursekit.experiments.recompute's (no wall-clock asserted).

Seen failing (planted in coursekit/parallel/recompute.py, reverted):

* selective recomputing the MLP too (``ln2 → fc → gelu → out`` also under ``checkpoint``): 'selective, b 4 s 31
  h 64 a 4: saved 223200, cost model 507904 + LayerNorm stats 1984', 'plateaus {..., 'none': 1216448,
  'selective': 520064, ...}' and 'selective: recomputed 9110528 FLOPs (torch's early stop), hand-derived 984064';
* full saving each half-block's output (attention and MLP checkpointed apart): 'full, b 4 s 31 h 64 a 4: saved
  63488, cost model 31744 + LayerNorm stats 0' and 'full: recomputed 16189440 FLOPs (torch's early stop),
  hand-derived 18221056';
* the policy ignored (every block built with ``"none"``): 'selective, b 4 s 31 h 64 a 4: saved 571392, cost
  model 507904 + LayerNorm stats 1984', 'full, ...: saved 571392, cost model 31744 + ...', 'selective: recomputed
  0 FLOPs (torch's early stop), hand-derived 984064';
* full checkpointing a detached input (``checkpoint(self.layer, x.detach(), ...)``): 'full: gradient of
  tok_emb.weight differs from none's (max |diff| 0.0729)'.
"""

import pytest
import torch

from coursekit.costmodel import ModelConfig, activation_bytes_per_layer, compute_flops
from coursekit.experiments.recompute import course_model, layer_saved_bytes, step_flops, step_memory
from coursekit.models import LanguageData, loss_fn
from coursekit.parallel.recompute import POLICIES, apply_recompute

B, S, H, A, L = 4, 31, 64, 4, 2          # the course transformer's default shape, 4 sequences of 31 tokens


@pytest.fixture(scope="module")
def batch():
    return LanguageData().batch(step=0, batch_size=B)


def _step(variant, batch):
    model = course_model(variant)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def test_loss_and_gradients_equal_across_policies(batch):
    """Bit for bit across none / selective / full: the same explicit attention under each, and a recomputation
    reruns the same CPU kernels on the same inputs in the same order. Against the course model as it is (the fused
    scaled_dot_product_attention) to float32 rounding: another summation order inside attention."""
    loss, grads = _step("none", batch)
    for policy in ("selective", "full"):
        other_loss, other = _step(policy, batch)
        assert torch.equal(other_loss, loss), f"{policy}: loss {other_loss.item()} != none's {loss.item()}"
        assert other.keys() == grads.keys(), f"{policy}: parameter names changed"
        for name, g in grads.items():
            assert torch.equal(other[name], g), \
                f"{policy}: gradient of {name} differs from none's (max |diff| {(other[name] - g).abs().max():.3g})"
    fused_loss, fused = _step("fused", batch)
    torch.testing.assert_close(fused_loss, loss)
    for name, g in grads.items():
        torch.testing.assert_close(fused[name], g, msg=lambda m: f"fused vs none, {name}: {m}")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("b, s, h, a", [(B, S, H, A), (2, 64, 128, 8)], ids=["course", "wider"])
def test_saved_bytes_per_layer_equal_the_cost_model(policy, b, s, h, a):
    """What autograd keeps for one block = activation_bytes_per_layer(recompute=policy), fp32, no dropout, exactly,
    plus the one term Table 2 leaves out: the two LayerNorms' mean and 1/std (2 floats a token each), which
    only a layer that is not checkpointed whole keeps. By hand, elements of s·b·h at 4 bytes: none 16 and the
    probabilities a·s²·b once (no dropout: the second matmul keeps the softmax output itself); selective the
    16 only (Q, K and V kept as the checkpoint's inputs, the probabilities redone); full the block's input, 1."""
    measured = layer_saved_bytes(policy, b, s, h, a)
    model = activation_bytes_per_layer(s, b, h, a, recompute=policy, bytes_per_element=4, dropout=False).total
    stats = 0 if policy == "full" else 2 * 2 * s * b * 4
    assert measured == model + stats, \
        f"{policy}, b {b} s {s} h {h} a {a}: saved {measured}, cost model {model} + LayerNorm stats {stats}"
    by_hand = {"none": 4 * (16 * s * b * h + a * s * s * b), "selective": 4 * 16 * s * b * h, "full": 4 * s * b * h}
    assert model == by_hand[policy], f"{policy}: the cost model's {model} != Table 2 by hand {by_hand[policy]}"


def test_what_the_step_holds_after_its_forward(batch):
    """The whole step's plateau (LiveMemory, live bytes at the end of the forward): selective holds exactly the
    probabilities less than none, L·a·s²·b floats; full less than selective; the fused kernel as much as selective
    and the log-sum-exp (a floats a token a layer)."""
    plateau = {v: step_memory(course_model(v), *batch)[0] for v in ("fused",) + POLICIES}
    assert plateau["none"] - plateau["selective"] == L * 4 * A * S * S * B, f"plateaus {plateau}"
    assert plateau["full"] < plateau["selective"], \
        f"full: plateau {plateau['full']}, not below selective's {plateau['selective']}"
    assert plateau["fused"] - plateau["selective"] == L * 4 * A * S * B, f"plateaus {plateau}"


def test_recomputed_flops_are_hand_derived(batch):
    """FLOPs (FlopCounterMode: 2·m·n·k a matrix product) of one step beyond none's, with T = b·s tokens:

    * selective redoes QKᵀ and P·V, 2·b·a·s²·(h/a) = 2bs²h each: 4bs²h a layer -- the cost model's
      compute_flops(recompute="selective"), exactly. PyTorch's non-reentrant checkpoint stops early by default:
      P·V's output is saved by no one (the projection keeps its own reshaped copy), so it is not redone: 2bs²h;
    * full redoes the block's forward: qkv 2T·3h², proj 2T·h², fc and out 2T·4h² each, attention 4bs²h; early
      stop skips the last product, out's 8Th². The cost model counts 2 FLOPs a parameter a token, the norms' and
      biases' 10h a layer too: 20hT a layer above what FlopCounterMode counts.
    """
    tokens = B * S
    none = step_flops(course_model("none"), *batch), step_flops(course_model("none"), *batch, early_stop=False)
    expected = {"selective": (2 * B * S * S * H * L, 4 * B * S * S * H * L),
                "full": ((16 * tokens * H * H + 4 * B * S * S * H) * L, (24 * tokens * H * H + 4 * B * S * S * H) * L)}
    for policy, (early, whole) in expected.items():
        model = course_model(policy)
        got = step_flops(model, *batch) - none[0], step_flops(model, *batch, early_stop=False) - none[1]
        assert got[0] == early, f"{policy}: recomputed {got[0]} FLOPs (torch's early stop), hand-derived {early}"
        assert got[1] == whole, f"{policy}: recomputed {got[1]} FLOPs (a whole forward), hand-derived {whole}"
    config = ModelConfig(16, S, H, L, A, qkv_bias=False)
    assert compute_flops(config, tokens, "selective").recompute == expected["selective"][1]
    assert compute_flops(config, tokens, "full").recompute - expected["full"][1] == 20 * H * tokens * L


def test_policies_are_checked():
    with pytest.raises(ValueError, match="policy must be one of"):
        apply_recompute(course_model("fused"), "some")
