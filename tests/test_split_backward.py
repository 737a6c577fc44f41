"""The split backward (coursekit.parallel.pipeline.split_backward): B then W give exactly one backward's gradients,
and together do one backward's matmuls -- W none of the activation-gradient ones.

Every check here was seen failing on a planted bug, named in its docstring. Expected counts come from the
layers' sizes (a linear layer's backward: one matmul for dX, one for dW), not from a run of the code.
"""

import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from coursekit.models import tiny_mlp, tiny_transformer
from coursekit.parallel.pipeline import backward_input, backward_weight, split

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
D, V, S, BATCH = 64, 16, 31, 3


class Matmuls(TorchDispatchMode):
    """Counts the matmuls run inside it, and their multiply-adds (m·k·n each)."""

    def __init__(self):
        super().__init__()
        self.calls, self.macs = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in MATMULS:
            a, b = args[-2], args[-1]
            self.calls += 1
            self.macs += a.shape[:-1].numel() * a.shape[-1] * b.shape[-1]
        return out


class UsedTwice(nn.Module):
    """One weight at two places of one stage: ``relu(ln(x)·W)·W`` -- its gradient leaves the trunk twice."""

    def __init__(self):
        super().__init__()
        self.ln, self.w = nn.LayerNorm(D), nn.Parameter(torch.randn(D, D, generator=torch.Generator().manual_seed(1)) / 8)

    def forward(self, x):
        return torch.relu(self.ln(x) @ self.w) @ self.w


def _mse(out, target):
    return F.mse_loss(out, target)


def _xent(out, target):
    return F.cross_entropy(out.reshape(-1, V), target.reshape(-1))


def _cases():
    """(name, stage, inputs per micro-batch, loss or None (then a random output gradient), linear layers)."""
    g = torch.Generator().manual_seed(0)
    mlp = split(tiny_mlp(n_layers=4), 4)
    blocks = split(tiny_transformer(n_layers=2), 4, layers_per_stage=[1, 1, 1, 1])
    hidden = [torch.randn(BATCH, S, D, generator=g) for _ in range(3)]
    tokens = [torch.randint(V, (BATCH, S), generator=g) for _ in range(3)]
    mlp_in = [torch.randn(BATCH, 64, generator=g) for _ in range(3)]
    linear = [(m.in_features, m.out_features) for m in mlp[1].modules() if isinstance(m, nn.Linear)]
    block = [(m.in_features, m.out_features) for m in blocks[1].modules() if isinstance(m, nn.Linear)]
    frozen = split(tiny_transformer(n_layers=2), 4, layers_per_stage=[1, 1, 1, 1])[2]
    for p in (*frozen[0].ln1.parameters(), frozen[0].attn.proj.bias):
        p.requires_grad_(False)
    return [
        ("mlp, first stage", mlp[0], [torch.randn(BATCH, 16, generator=g) for _ in range(3)], None, None),
        ("mlp, first two layers", nn.Sequential(*mlp[:2]), [torch.randn(BATCH, 16, generator=g) for _ in range(3)],
         None, None),
        ("mlp, middle stage", mlp[1], mlp_in, None, linear),
        ("mlp, three layers and the loss", nn.Sequential(*mlp[1:]), mlp_in,
         (_mse, [torch.randn(BATCH, 4, generator=g) for _ in range(3)]), linear * 2 + [(64, 4)]),
        ("transformer, embedding", blocks[0], tokens, None, None),
        ("transformer, block (LayerNorm, attention)", blocks[1], hidden, None, block),
        ("transformer, block, a LayerNorm and a bias frozen", frozen, hidden, None, block),
        ("transformer, head (tied weight) and the loss", blocks[3], hidden, (_xent, tokens), [(D, V)]),
        ("transformer, block and head", nn.Sequential(blocks[2], blocks[3]), hidden, (_xent, tokens),
         block + [(D, V)]),
        ("a weight used twice", UsedTwice(), hidden, None, [(D, D)] * 2),
    ]


def _run(stage, x, loss, i, split_backward: bool, counter=None, first=False):
    """Forward micro-batch ``i``, then its backward (split: B only, W returned for later). The ``first`` stage's
    input (the batch) needs no gradient; any other stage's does."""
    x = x.detach().requires_grad_(not first)
    out = stage(x)
    grad = None
    if loss is not None:
        out = loss[0](out, loss[1][i])
    else:
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + i))
    if not split_backward:
        with counter or Matmuls():
            torch.autograd.backward(out, grad)
        return x.grad, None
    with counter or Matmuls():
        (dx,), work = backward_input([out], [grad], [x], stage.parameters())
    return dx, work


def _gradients(stage):
    grads = {name: p.grad.clone() for name, p in stage.named_parameters() if p.grad is not None}
    stage.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_b_then_w_give_one_full_backwards_gradients(case):
    """Three micro-batches: their B's in order, then their W's last first (as a deferred W runs); every parameter's
    accumulated ``.grad`` and every input gradient equal to three full backwards (same names: a W missing a
    parameter fails too).

    Planted bugs seen failing: W overwriting ``.grad`` instead of adding (``mlp, first stage``: '0.0.weight', every
    element off: only the last micro-batch's left); no pin on the lower node of a weight used twice (``a weight
    used twice``: 'w', every element off: the gradient down the trunk counted twice)."""
    _, stage, inputs, loss, linears = case
    expected_dx = [_run(stage, x, loss, i, False, first=linears is None)[0] for i, x in enumerate(inputs)]
    expected = _gradients(stage)
    got_dx, works = zip(*(_run(stage, x, loss, i, True, first=linears is None) for i, x in enumerate(inputs)))
    assert not any(p.grad is not None for p in stage.parameters()), "B added into a weight's .grad"
    for work in reversed(works):
        backward_weight(work)
    got = _gradients(stage)
    assert sorted(got) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    for i, (want, dx) in enumerate(zip(expected_dx, got_dx)):
        assert (want is None) == (dx is None), f"micro-batch {i}: input gradient"
        if want is not None:
            torch.testing.assert_close(dx, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_b_and_w_together_do_one_backwards_matmuls_and_w_only_the_weights(case):
    """Counted with a dispatch mode, for one micro-batch: B + W run as many matmuls, of as many multiply-adds, as
    one full backward. Where the stage input needs a gradient, W's are exactly the weight gradients -- one
    ``dW = dYᵀ·X`` per use of a weight in a linear map, rows·in·out multiply-adds each -- and B's the same number
    of ``dX = dY·W`` (a stage's own attention scores are not matmuls on CPU: a fused kernel). A weight used twice
    is the one exception: W computes the gradient down the trunk between its two uses again (one matmul more). On
    the first stage (no input gradient) B does nothing and W one full backward.

    Planted bug seen failing: W running autograd from the stage output again, as the executor did before
    (``mlp, middle stage``: "B 1 + W 2 matmuls, one backward 2"; a transformer block: B 4 + W 8, one backward 8)."""
    _, stage, inputs, loss, linears = case
    full, b, w = Matmuls(), Matmuls(), Matmuls()
    _run(stage, inputs[0], loss, 0, False, full, first=linears is None)
    _, work = _run(stage, inputs[0], loss, 0, True, b, first=linears is None)
    with w:
        backward_weight(work)
    stage.zero_grad(set_to_none=True)
    rows = inputs[0].shape[:-1].numel() if inputs[0].is_floating_point() else inputs[0].numel()
    twice = isinstance(stage, UsedTwice)
    assert b.calls + w.calls == full.calls + twice, f"B {b.calls} + W {w.calls} matmuls, one backward {full.calls}"
    assert b.macs + w.macs == full.macs + twice * rows * D * D
    if linears is None:  # the first stage: nothing to send back, so B has nothing to do
        assert b.calls == 0
        return
    weight_macs = sum(rows * d_in * d_out for d_in, d_out in linears)
    assert (w.calls, w.macs) == (len(linears) + twice, weight_macs + twice * rows * D * D), "W's matmuls"
    assert (b.calls, b.macs) == (len(linears), weight_macs), "B's matmuls"


def test_what_w_keeps_is_the_gradient_at_each_layer():
    """B keeps one ``dY`` per linear layer (batch × out_features), not the stage's output gradient alone; after W
    nothing is kept.

    Planted bug seen failing: ``kept()`` returning nothing (``[] == [(5, 64), (5, 64)]``)."""
    stage = split(tiny_mlp(n_layers=4), 4)[1]
    stage = nn.Sequential(stage, split(tiny_mlp(n_layers=4), 4)[2])
    x = torch.randn(5, 64, requires_grad=True)
    out = stage(x)
    _, work = backward_input([out], [torch.ones_like(out)], [x], stage.parameters())
    assert sorted(tuple(t.shape) for t in work.kept()) == [(5, 64), (5, 64)]
    backward_weight(work)
    assert work.kept() == []


class HeldProducts(TorchDispatchMode):
    """Before each matmul, the bytes of this run's earlier matmul results still alive and not a ``.grad``: what a
    backward holds beside the gradients it has accumulated; ``most``, the largest such figure."""

    def __init__(self, stage):
        super().__init__()
        self.stage, self.outputs, self.most = stage, [], 0

    def held(self) -> int:
        grads = {p.grad.untyped_storage().data_ptr() for p in self.stage.parameters() if p.grad is not None}
        alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (r() for r in self.outputs)
                 if t is not None}
        return sum(n for ptr, n in alive.items() if ptr not in grads)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.most = max(self.most, self.held())
        out = func(*args, **(kwargs or {}))
        if func in MATMULS:
            self.outputs.append(weakref.ref(out))
        return out


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_w_adds_each_weight_gradient_before_computing_the_next(case):
    """W holds no more matmul results beside ``.grad`` than one full backward does: each weight's gradient is
    added into ``.grad`` (and its buffer freed) before the next is computed. Measured on a second micro-batch, so
    every ``.grad`` exists and nothing is stolen into it.

    Why it matters: holding every layer's ``dW`` until the end made the allocator hand fresh memory back to the
    system and fault it in again, and W's matmuls ran 1.7× slower than the same matmuls in one backward.

    Planted bug seen failing: W collecting every gradient with ``autograd.grad`` and adding them at the end, as
    it did before (``mlp, three layers and the loss``: "W held 32,768 bytes of matmul results beside .grad, one
    backward 2,304"; ``mlp, first two layers``, the whole backward of a first stage: 16,384 against 1,536)."""
    _, stage, inputs, loss, linears = case
    first = linears is None
    _run(stage, inputs[0], loss, 0, False, first=first)              # every .grad now exists
    full = HeldProducts(stage)
    with full:
        _run(stage, inputs[1], loss, 1, False, first=first)
    _, work = _run(stage, inputs[1], loss, 1, True, first=first)
    w = HeldProducts(stage)
    with w:
        backward_weight(work)
    w.most = max(w.most, w.held())                                   # and nothing left over at the end
    stage.zero_grad(set_to_none=True)
    assert w.most <= full.most, f"W held {w.most:,} bytes of matmul results beside .grad, one backward {full.most:,}"
