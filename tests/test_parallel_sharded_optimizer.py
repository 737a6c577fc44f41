"""ShardedOptimizer (ZeRO-1 as a torch.optim.Optimizer): equal to the unsharded optimiser and to PyTorch's
ZeroRedundancyOptimizer, state bytes and traffic exactly as the formulas say, checkpoints that continue exactly.

The optimiser-style loop throughout: a plain model, ``loss.backward()``, the gradients averaged by data
parallelism, ``opt.step()``, ``opt.zero_grad()``.
"""

import pytest
import torch
import torch.distributed as dist

import coursekit
from coursekit.collectives import TORCH, owned_segment, segment_bounds
from coursekit.measure.memory import held_bytes
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel.data import ShardedOptimizer, average_gradients, shard_batch
from coursekit.strategy import optimizer_tensors
from coursekit.train import train
from coursekit.measure.verify import TOLERANCES, assert_equivalent, compare, record_step

from strategy_options import config_for

DATA = LanguageData()
BATCH = 10  # not divisible by 3 or 4: the ranks' slices differ in size
# name: (class, arguments, weight decay of group 0 (matrices) and group 1 (biases, norms), collectives)
CONFIGS = {"adamw": (torch.optim.AdamW, dict(lr=1e-2), (0.1, 0.0), "ring"),
           "sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9), (1e-2, 0.0), "torch")}


def _model(dtype=torch.float64) -> torch.nn.Module:
    """The course transformer (head tied to tok_emb) with pos_emb frozen."""
    model = tiny_transformer(seed=0).to(dtype)
    model.pos_emb.weight.requires_grad_(False)
    return model


def _groups(model, decays) -> list[dict]:
    """Matrices with weight decay (the frozen pos_emb among them), vectors without, as usual for AdamW."""
    params = list(model.parameters())  # the tied weight once
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": decays[0]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": decays[1]}]


def _optimizer(model, name: str, sharded: bool, **options):
    """AdamW with both groups given at once; SGD with the second added by ``add_param_group``."""
    cls, kwargs, decays, collectives = CONFIGS[name]
    groups = _groups(model, decays)
    first = groups if name == "adamw" else groups[:1]
    opt = ShardedOptimizer(first, cls, collectives=collectives, **kwargs, **options) if sharded \
        else cls(first, **kwargs)
    if name == "sgd":
        opt.add_param_group(groups[1])
    return opt


def _global_loss(local: float, world_size: int) -> float:
    total = torch.tensor([local], dtype=torch.float64)
    if world_size > 1:
        dist.all_reduce(total)
    return total.item()


def _train(model, opt, steps: int, rank: int = 0, world_size: int = 1, start: int = 0) -> list[dict]:
    """The user's loop on this rank's slice of each global batch; one verify record per step."""
    records = []
    for step in range(start, start + steps):
        x, y, weight = shard_batch(*DATA.batch(step, BATCH), rank, world_size)
        output = model(x)
        loss = loss_fn(output, y) * weight
        loss.backward()
        if world_size > 1 and not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            average_gradients(model, all_reduce=TORCH.all_reduce)  # the user's data parallelism
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        records.append(record_step(output, _global_loss(loss.item() / world_size, world_size), grads, model))
        opt.zero_grad(set_to_none=step % 2 == 0)
    return records


_references: dict = {}


def _reference(name: str, steps: int = 10) -> list[dict]:
    """One process, the whole global batch, the unsharded optimiser (cached)."""
    if name not in _references:
        model = _model()
        _references[name] = _train(model, _optimizer(model, name, sharded=False), steps)
    return _references[name]


# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_equals_the_unsharded_optimizer_after_every_step(world_size):
    """AdamW and SGD-momentum, 10 steps, two param groups (weight decay on matrices only), a tied head and a
    frozen pos_emb; each rank takes its slice of the global batch and the gradients are averaged (torch's
    all-reduce) before ``opt.step()``. Parameters, gradients, outputs and loss are compared after every step.

    float64, because in float32 plain data parallelism itself (no sharding) already leaves one process by
    2.6e-3 after 3 AdamW steps: a weight whose true gradient is 0 gets rounding noise (6e-10 in one process,
    4.7e-9 summed over 3 ranks) that Adam, with |g| below eps, turns into different steps. In float64 that
    noise is far below eps. (The float32 comparison with ZeroRedundancyOptimizer below shares the gradients.)

    Planted bugs caught (the first divergence named): the groups' own settings dropped (inner optimiser built
    from ``**defaults`` only, never synced): step 0, 'tok_emb.weight', already on 1 rank; the all-gather
    skipped for the second group: step 0, 'blocks.0.ln1.weight' expected 1.00999, got 1 (2 ranks); the frozen
    pos_emb put in the flat buffer with a zero gradient (AdamW decays it): step 0, 'pos_emb.weight'; segment
    ``rank`` stepped instead of ``owned_segment(rank)``: step 0, 'tok_emb.weight' at 2 ranks, and at 3 the
    ring's all-gather refuses it ("rank 0 owns segment 1 ... but was given a segment of 33110 elements").
    """
    def run(rank, n):
        out = []
        for name in CONFIGS:
            model = _model()
            out.append(_train(model, _optimizer(model, name, sharded=True), 10, rank, n))
            assert model.head.weight is model.tok_emb.weight, "the tie survives flattening"
        return out

    results = coursekit.launch(run, world_size, timeout=300)
    for i, name in enumerate(CONFIGS):
        report = compare(_reference(name), [results[r][i] for r in range(world_size)])
        assert report.ok, f"{name} on {world_size} ranks: {report}"


def test_optimizer_state_bytes_per_rank_match_the_formula():
    """Each rank holds the state of its segment of each group only: AdamW ``8·s_g + 4`` bytes per group
    (exp_avg, exp_avg_sq in fp32 over the s_g elements of segment (r+1)%N, a 4-byte step), SGD momentum
    ``4·s_g``; Ψ_g counted here from the model's shapes. The parameters are not copied (the flat buffers
    replace them) and no gradient segment is kept after the step.

    Planted bugs caught: every rank stepping all the parameters (the inner optimiser over the model's
    parameters, i.e. plain data parallelism, which the equivalence test cannot tell apart): AdamW state
    805988 bytes on rank 0, expected 268632; the frozen pos_emb in the flat buffer: 279560, expected 268632;
    the gradient segment kept after the step: 553640 bytes of parameters and gradients instead of 4Ψ.
    """
    world_size = 3
    model = tiny_transformer(seed=0)
    model.pos_emb.weight.requires_grad_(False)
    sizes = [sum(p.numel() for p in model.parameters() if p.requires_grad and (p.dim() >= 2) == matrices)
             for matrices in (True, False)]
    everything = sum(p.numel() for p in model.parameters())
    assert sum(sizes) == everything - 64 * 64  # pos_emb (64 x 64) frozen; tok_emb counted once (tied)

    def run(rank, n):
        out = {}
        for name in CONFIGS:
            model = _model(torch.float32)
            opt = _optimizer(model, name, sharded=True)
            _train(model, opt, 2, rank, n)
            opt.zero_grad(set_to_none=True)
            kept = [p.grad for g in opt.optim.param_groups for p in g["params"] if p.grad is not None]
            out[name] = (held_bytes(optimizer_tensors(opt)), held_bytes(list(model.parameters()) + kept),
                         sum(p.numel() for p in opt.optim.state))
        return out

    results = coursekit.launch(run, world_size, timeout=300)
    total_state = {name: 0 for name in CONFIGS}
    for rank in range(world_size):
        mine = [stop - start for start, stop in (segment_bounds(psi, world_size)[owned_segment(rank, world_size)]
                                                  for psi in sizes)]
        expected = {"adamw": sum(8 * s + 4 for s in mine), "sgd": sum(4 * s for s in mine)}
        for name in CONFIGS:
            state, params, elements = results[rank][name]
            assert state == expected[name], f"{name}, rank {rank}: {state} bytes of state, expected {expected[name]}"
            assert params == 4 * everything, f"{name}, rank {rank}: {params} bytes, a parameter copy or a gradient kept"
            assert elements == sum(mine)
            total_state[name] += state
    # all ranks together hold exactly one unsharded optimiser's moments (plus one step counter per group and rank)
    psi = sum(sizes)
    assert total_state == {"adamw": 8 * psi + 4 * 2 * world_size, "sgd": 4 * psi}
    unsharded = torch.optim.AdamW(_groups(model, (0.1, 0.0)))
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    unsharded.step()
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    assert held_bytes(optimizer_tensors(unsharded)) == 8 * psi + 4 * tensors  # a step counter per tensor


def test_traffic_is_one_ring_all_gather_per_group_and_step():
    """With ``collectives="ring"`` a step sends (N−1)·Ψ_g elements per group in all; rank r sends
    Ψ_g − len(segment (r+2) % N) of each (chapter 01's all-gather); the optimiser itself does nothing else.

    Planted bug caught: the all-gather skipped for the second group: 397312 elements instead of 402944.
    """
    world_size, steps = 3, 2

    def run(rank, n):
        model = _model(torch.float32)
        opt = _optimizer(model, "adamw", sharded=True)
        with coursekit.comm.record() as traffic:
            for step in range(steps):
                x, y, w = shard_batch(*DATA.batch(step, BATCH), rank, n)
                (loss_fn(model(x), y) * w).backward()
                average_gradients(model, all_reduce=TORCH.all_reduce)  # torch's: not recorded
                opt.step()
                opt.zero_grad()
        return traffic

    traffic = coursekit.comm.Traffic.merge(coursekit.launch(run, world_size, timeout=120))
    model = _model(torch.float32)
    sizes = [sum(p.numel() for p in g["params"] if p.requires_grad) for g in _groups(model, (0, 0))]
    assert traffic.total == steps * (world_size - 1) * sum(sizes)
    def length(psi, k):
        start, stop = segment_bounds(psi, world_size)[k]
        return stop - start

    expected = {r: steps * sum(psi - length(psi, (r + 2) % world_size) for psi in sizes) for r in range(world_size)}
    assert traffic.sent == expected


# --------------------------------------------------------------------------------------------------------
def _assert_same_state(ours: dict, theirs: dict, dtype: torch.dtype) -> None:
    """Two full optimiser state dicts: the same groups and entries, values within verify's TOLERANCES."""
    assert ours["param_groups"] == theirs["param_groups"]
    assert sorted(ours["state"]) == sorted(theirs["state"]), "state for different parameters"
    tol_r, tol_a = TOLERANCES[dtype]
    for index, entry in theirs["state"].items():
        assert sorted(ours["state"][index]) == sorted(entry), f"parameter {index}: different state entries"
        for key, value in entry.items():
            torch.testing.assert_close(ours["state"][index][key], value, rtol=tol_r, atol=tol_a,
                                       msg=lambda m: f"state {key!r} of parameter {index}: {m}")


def _checkpoint_reference(tmp_path):
    """One process: 5 AdamW steps, an LR change in group 1 (as a scheduler would), its state saved, 5 more."""
    model = _model()
    opt = _optimizer(model, "adamw", sharded=False)
    _train(model, opt, 5)
    opt.param_groups[1]["lr"] = 5e-3
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, tmp_path / "plain.pt")
    state = {"state": {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()},
             "param_groups": [dict(g) for g in opt.state_dict()["param_groups"]]}
    return state, _train(model, opt, 5, start=5)


def test_checkpoint_round_trip_continues_identically_at_any_world_size(tmp_path):
    """3 ranks train 5 steps, change group 1's LR, ``consolidate_state_dict(to=0)`` and save on rank 0, then
    go on 5 steps. From that file, 2 ranks (ShardedOptimizer) and one process (plain AdamW) resume; 2 ranks
    also resume from the plain AdamW's own checkpoint. All four runs of steps 5-9 equal one process that
    never stopped; the consolidated state equals the plain AdamW's state dict, entry by entry.

    Planted bugs caught: segments concatenated in rank order instead of the owners' order (k−1)%N: state
    'exp_avg' of parameter 0 differs in all 1024 elements; ``load_state_dict`` ignoring the saved settings:
    the resumed group 1 has lr 0.01, not 0.005; ``step`` reset to 0 on loading (bias correction): "resumed
    on 2 ranks" diverges at its first step (step 5), 'tok_emb.weight'; the outer groups' settings not copied
    to the inner optimiser before a step: "uninterrupted" ignores the LR change (step 5, 'blocks.0.ln1.weight').
    """
    plain_state, reference = _checkpoint_reference(tmp_path)
    path = str(tmp_path / "sharded.pt")

    def first(rank, n):
        model = _model()
        opt = _optimizer(model, "adamw", sharded=True)
        _train(model, opt, 5, rank, n)
        opt.param_groups[1]["lr"] = 5e-3
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
        else:
            with pytest.raises(RuntimeError, match="consolidate_state_dict"):
                opt.state_dict()
        dist.barrier()
        return _train(model, opt, 5, rank, n, start=5)

    def resume(rank, n):
        out = []
        for file in (path, str(tmp_path / "plain.pt")):
            saved = torch.load(file)
            model = _model()
            model.load_state_dict(saved["model"])
            opt = _optimizer(model, "adamw", sharded=True)
            opt.load_state_dict(saved["optim"])
            assert opt.param_groups[1]["lr"] == 5e-3 and opt.param_groups[0]["lr"] == 1e-2
            out.append(_train(model, opt, 5, rank, n, start=5))
        return out

    uninterrupted = coursekit.launch(first, 3, timeout=300)
    saved = torch.load(path)
    _assert_same_state(saved["optim"], plain_state, torch.float64)  # no entry for the frozen pos_emb either
    resumed = coursekit.launch(resume, 2, timeout=300)
    model = _model()
    model.load_state_dict(saved["model"])
    plain = _optimizer(model, "adamw", sharded=False)
    plain.load_state_dict(saved["optim"])
    runs = {"uninterrupted, 3 ranks": uninterrupted, "resumed on 2 ranks": [r[0] for r in resumed],
            "resumed from plain AdamW's checkpoint on 2 ranks": [r[1] for r in resumed],
            "plain AdamW resumed": [_train(model, plain, 5, start=5)]}
    for what, ranks in runs.items():
        report = compare(reference, ranks)
        assert report.ok, f"{what}: {report}"


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")  # torch.distributed.optim's own imports
def test_side_by_side_with_torch_zero_redundancy_optimizer():
    """The same model (wrapped in torch DDP), ranks and batches: torch's ``ZeroRedundancyOptimizer(params,
    optimizer_class=torch.optim.AdamW, ...)`` and ``ShardedOptimizer(params, torch.optim.AdamW, ...)`` give
    equal parameters after each of 5 steps (float32, verify's TOLERANCES), on 3 ranks; their consolidated
    state dicts have the same format and agree entry by entry.

    Planted bugs caught: the groups' settings dropped: step 0, 'module.tok_emb.weight', rank 0; the
    all-gather skipped for the second group: step 0, 'module.blocks.0.ln1.weight'; segments reassembled in
    rank order: state 'exp_avg' of parameter 0 (1021 of 1024 elements differ).
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    def run(rank, n):
        out = []
        for which in ("torch", "coursekit"):
            model = DistributedDataParallel(_model(torch.float32))
            groups = _groups(model.module, (0.1, 0.0))
            opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=1e-2) if which == "torch" \
                else ShardedOptimizer(groups, torch.optim.AdamW, lr=1e-2)
            records = _train(model, opt, 5, rank, n)
            opt.consolidate_state_dict(to=0)
            out.append((records, opt.state_dict() if rank == 0 else None))
        return out

    results = coursekit.launch(run, 3, timeout=300)
    for rank, ((theirs, _), (ours, _)) in enumerate(results):
        report = compare(theirs, [ours])
        assert report.ok, f"rank {rank}: ShardedOptimizer against ZeroRedundancyOptimizer: {report}"
    (_, theirs), (_, ours) = results[0]
    _assert_same_state(ours, theirs, torch.float32)


# --------------------------------------------------------------------------------------------------------
class _PlainSGD(torch.optim.Optimizer):
    """An optimiser torch does not ship (element-wise: p -= lr * g)."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def _linear(dtype=torch.float32):
    layer = torch.nn.Linear(3, 2).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(6.0).view(2, 3) / 10)
        layer.bias.fill_(0.5)
    return layer


def test_bad_input_is_refused_with_a_reason():
    """Non-element-wise optimisers, instances instead of classes, unknown classes, mixed dtypes in a group,
    gradients on part of a group, a frozen parameter given a gradient later, a model moved after building,
    and state dicts that do not fit each get an error that says what to do.

    Planted bugs caught: no dtype check (a float64 parameter silently becomes float32): "DID NOT RAISE
    ValueError"; a partly missing gradient read as zero: "DID NOT RAISE RuntimeError"; LBFGS missing from
    the refused list: only the generic "not one of torch's element-wise optimisers", no reason (line search).
    """
    layer = _linear()
    params = list(layer.parameters())
    with pytest.raises(ValueError, match="LBFGS cannot be sharded.*line search"):
        ShardedOptimizer(params, torch.optim.LBFGS)
    with pytest.raises(ValueError, match="Adafactor cannot be sharded.*row and column"):
        ShardedOptimizer(params, torch.optim.Adafactor)
    with pytest.raises(TypeError, match="pass the class, not an instance"):
        ShardedOptimizer(params, torch.optim.AdamW(params))
    with pytest.raises(ValueError, match="_PlainSGD is not one of torch's element-wise.*elementwise=True"):
        ShardedOptimizer(params, _PlainSGD)
    mixed = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]
    with pytest.raises(ValueError, match="param group 0 mixes dtypes.*param group of their own"):
        ShardedOptimizer(mixed, torch.optim.SGD, lr=0.1)
    ShardedOptimizer([{"params": [mixed[0]]}, {"params": [mixed[1]]}], torch.optim.SGD, lr=0.1)  # fine

    opt = ShardedOptimizer(layer.parameters(), torch.optim.AdamW)
    layer.weight.grad = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="1 of 2 trainable parameters have no gradient.*zero_grad"):
        opt.step()
    with pytest.raises(RuntimeError, match=r"consolidate_state_dict\(to=0\)"):
        opt.state_dict()
    with pytest.raises(ValueError, match="ranks 0..0"):
        opt.consolidate_state_dict(to=1)
    opt.consolidate_state_dict()
    with pytest.raises(ValueError, match="param groups do not match"):
        ShardedOptimizer([layer.weight], torch.optim.AdamW).load_state_dict(opt.state_dict())

    frozen = _linear()
    frozen.bias.requires_grad_(False)
    opt = ShardedOptimizer(frozen.parameters(), torch.optim.SGD, lr=0.1)
    frozen.bias.requires_grad_(True)
    loss_fn(frozen(torch.ones(4, 3)), torch.zeros(4, dtype=torch.long)).backward()
    with pytest.raises(RuntimeError, match="frozen when the group was added"):
        opt.step()

    moved = _linear()
    opt = ShardedOptimizer(moved.parameters(), torch.optim.SGD, lr=0.1)
    moved.double()
    loss_fn(moved(torch.ones(4, 3, dtype=torch.float64)), torch.zeros(4, dtype=torch.long)).backward()
    with pytest.raises(RuntimeError, match="no longer lives in the optimiser's flat buffer"):
        opt.step()


def test_optimizer_basics_without_a_process_group():
    """Without ``torch.distributed`` it is the plain optimiser (one segment: everything). ``zero_grad``
    honours ``set_to_none``; a step with no gradient at all changes nothing (as torch's); an optimiser
    torch does not ship is accepted with ``elementwise=True`` and equals itself unsharded; the parameters
    still train after being flattened.

    Planted bugs caught: ``zero_grad`` ignoring ``set_to_none`` (zeros left, not None); ``elementwise=True``
    ignored (ValueError "_PlainSGD is not one of torch's element-wise optimisers").
    """
    assert not dist.is_initialized()
    ours, theirs = _linear(), _linear()
    opt = ShardedOptimizer(ours.parameters(), _PlainSGD, elementwise=True, lr=0.5)
    reference = _PlainSGD(theirs.parameters(), lr=0.5)
    before = [p.clone() for p in ours.parameters()]
    opt.step()  # no gradients yet: nothing happens
    assert all(torch.equal(a, b) for a, b in zip(before, ours.parameters()))
    x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1] * 4)
    for set_to_none in (False, True, False):
        for model, optimizer in ((ours, opt), (theirs, reference)):
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=set_to_none)
        left = [None if p.grad is None else p.grad.abs().sum().item() for p in ours.parameters()]
        assert left == ([None, None] if set_to_none else [0.0, 0.0]), f"zero_grad(set_to_none={set_to_none}): {left}"
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)
    assert not torch.equal(before[0], ours.weight)


def test_more_ranks_than_elements_leaves_some_segments_empty():
    """The bias (2 elements, its own group and LR) on 4 ranks: ranks 1 and 2 own empty segments of it, hold
    no state for it, still receive its updates; AdamW equals itself unsharded and the state consolidated on
    the last rank is whole.

    Planted bug caught: an empty segment stepped anyway (AdamW keeps a step counter for it): "rank 1: 16
    bytes, segments [1, 0]", the formula 8·s + 4 per non-empty segment says 12.
    """
    def run(rank, n):
        layer = _linear()
        opt = ShardedOptimizer([{"params": [layer.weight]}, {"params": [layer.bias], "lr": 0.2}],
                               torch.optim.AdamW, lr=0.1, collectives="ring")
        x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1] * 4)
        for _ in range(3):
            loss_fn(layer(x), y).backward()  # the full batch on every rank: no averaging needed
            opt.step()
            opt.zero_grad()
        opt.consolidate_state_dict(to=n - 1)
        return layer.weight.clone(), layer.bias.clone(), held_bytes(optimizer_tensors(opt)), \
            opt.state_dict() if rank == n - 1 else None

    results = coursekit.launch(run, 4, timeout=120)
    layer = _linear()
    opt = torch.optim.AdamW([{"params": [layer.weight]}, {"params": [layer.bias], "lr": 0.2}], lr=0.1)
    x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1] * 4)
    for _ in range(3):
        loss_fn(layer(x), y).backward()
        opt.step()
        opt.zero_grad()
    for rank, (weight, bias, state, _) in enumerate(results):
        torch.testing.assert_close(weight, layer.weight, msg=lambda m: f"rank {rank}, weight: {m}")
        torch.testing.assert_close(bias, layer.bias, msg=lambda m: f"rank {rank}, bias: {m}")
        lengths = [(lambda b: b[1] - b[0])(segment_bounds(psi, 4)[owned_segment(rank, 4)]) for psi in (6, 2)]
        assert state == sum(8 * s + 4 for s in lengths if s), f"rank {rank}: {state} bytes, segments {lengths}"
    consolidated, reference = results[3][3], opt.state_dict()
    for index in (0, 1):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(consolidated["state"][index][key], reference["state"][index][key])


def _strategies(rank, world_size, configs):
    return [train(rank, world_size, strategy, **config_for(strategy, kwargs)) for strategy, kwargs in configs]


@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_in_the_training_loop_equals_one_process(world_size):
    """``train(..., strategy="sharded_optimizer")``: bucketed DataParallel + ShardedOptimizer equals
    ``"single"`` and PyTorch's ``"torch_zero1"`` (DDP + ZeroRedundancyOptimizer) -- Adam and SGD-momentum on
    the MLP, 3 steps; Adam on the transformer with pos_emb frozen, 2 steps, as the other strategies' test.
    The loop's memory accounting sees ``8·s + 4`` bytes of Adam state (one group: the loop's optimiser takes
    a list of parameters), ``4·s`` of momentum, and the ring traffic is the all-gather's ``(N−1)Ψ`` a step.

    Planted bug caught: the loop's optimiser arguments dropped (torch's default lr 1e-3 instead of 1e-2):
    step 0, 'layers.0.weight' on 2 ranks.
    """
    mlp = dict(model="mlp", steps=3, global_batch=10, bucket_elements=2000, collectives="ring", count_traffic=True)
    configs = [("sharded_optimizer", dict(mlp, optimizer="adam", lr=1e-2)),
               ("sharded_optimizer", dict(mlp, optimizer="sgd", lr=0.1)),
               ("sharded_optimizer", dict(model="transformer", steps=2, global_batch=6, optimizer="adam", lr=1e-3,
                                          collectives="torch", bucket_elements=20_000, freeze=("pos_emb.weight",))),
               ("torch_zero1", dict(mlp, optimizer="adam", lr=1e-2))]
    results = coursekit.launch(_strategies, world_size, configs, timeout=300)
    for i, (strategy, kwargs) in enumerate(configs):
        reference = train(0, 1, "single", **config_for("single", kwargs))["records"]
        report = compare(reference, [results[r][i]["records"] for r in range(world_size)])
        assert report.ok, f"{strategy}, {kwargs['model']}/{kwargs['optimizer']} on {world_size} ranks: {report}"
    assert_equivalent([r[3]["records"] for r in results][0], [results[0][0]["records"]])  # ours = torch's
    psi = results[0][0]["numel"]
    assert psi == sum(p.numel() for p in coursekit.models.tiny_mlp().parameters())
    for rank in range(world_size):
        start, stop = segment_bounds(psi, world_size)[owned_segment(rank, world_size)]
        assert results[rank][0]["memory"]["optimizer"] == 8 * (stop - start) + 4
        assert results[rank][1]["memory"]["optimizer"] == 4 * (stop - start)
    traffic = coursekit.comm.Traffic.merge([results[r][0]["traffic"] for r in range(world_size)])
    assert traffic.total == 3 * (world_size - 1) * psi  # bucketed all-reduces are torch's (not counted)
