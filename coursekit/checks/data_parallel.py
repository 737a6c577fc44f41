"""Checks of exercise 02 (``exercises/02_data_parallel.ipynb``): gradient averaging with hooks, ZeRO-2's reduce-scatter.

    from coursekit.checks.data_parallel import check_data_parallel
    check_data_parallel(attach_gradient_averaging, reduce_scatter_gradients)

The learner writes two functions:

* ``attach_gradient_averaging(model, group=None)``: register hooks so that,
  by the end of ``loss.backward()``, every trainable parameter's ``.grad`` is
  the average over the ranks (built on chapter 01's ``ring_all_reduce``) —
  also with gradient accumulation (several ``loss.backward()`` before the
  optimiser step): the hook averages the accumulated ``p.grad`` on every backward.
* ``reduce_scatter_gradients(model, group=None) -> Tensor``: after backward,
  ZeRO-2's step: the gradients of the trainable parameters, flattened in
  ``model.parameters()`` order, reduce-scattered with chapter 01's ring; return
  this rank's segment (``owned_segment(r, G)``) of the *averaged* gradient, as a
  tensor of its own (not a view into the flat buffer, which would keep every
  gradient alive), and free the full gradients (``p.grad = None``).

Each check trains on real ranks (``torch.distributed``'s collectives switched
off: everything goes through ``coursekit.comm`` and is counted), compares with
one process on the same global batch through :mod:`coursekit.verify`, and
counts the traffic against its formula.
"""

from __future__ import annotations

import functools

import torch

from .. import comm, grading
from ..collectives import owned_segment, ring_all_gather, segment_bounds
from ..models import LanguageData, TeacherData, loss_fn, tiny_mlp, tiny_transformer
from ..parallel.data import shard_batch
from ..verify import FlatShard, compare, record_step, reference_run

EXERCISE = "02_data_parallel"  # registered in grading.EXERCISE_MODULES, the one place exercises are named
# Said when torch.distributed's collectives are called (they are switched off while grading):
INSTEAD = ("use chapter 01's ring (from coursekit.collectives import ring_all_reduce, ring_reduce_scatter), "
           "so that every transfer is counted")


def check_data_parallel(attach_gradient_averaging=None, reduce_scatter_gradients=None, **options) -> grading.Report:
    """Grade exercise 02: pass the two functions you wrote (``None`` for a part not done yet)."""
    def not_done(*args, **kwargs):
        raise NotImplementedError
    return grading.grade(EXERCISE, attach_gradient_averaging=attach_gradient_averaging or not_done,
                         reduce_scatter_gradients=reduce_scatter_gradients or not_done, **options)


# ----------------------------------------------------------------------------- set-ups
FROZEN = "layers.1.bias"  # the MLP parameter the visible ZeRO-2 check freezes


def _setup(name: str, freeze: tuple = ()):
    if name == "mlp":
        model, data, make_opt = tiny_mlp(seed=0), TeacherData(), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    else:
        # SGD with momentum: Adam divides by sqrt(v), which turns the rounding noise of a gradient
        # that is almost exactly zero into a visible step, and would fail correct code by chance.
        model, data = tiny_transformer(seed=0), LanguageData(seq_len=12)
        make_opt = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    for n, p in model.named_parameters():
        if n in freeze:
            p.requires_grad_(False)
    return model, data, make_opt


@functools.lru_cache(maxsize=16)
def _reference(name, freeze, steps, global_batch):
    """One process on the global batches (cached: several checks share a reference; nobody mutates it)."""
    model, data, make_opt = _setup(name, freeze)
    optimizer = make_opt([p for p in model.parameters() if p.requires_grad])
    return reference_run(model, optimizer, [data.batch(s, global_batch) for s in range(steps)], loss_fn)


# ----------------------------------------------------------------------------- scoring (both parts)
def _global_losses(per_rank):
    """Each rank recorded its share of the loss; the global batch's loss is their sum (done here, not by ranks)."""
    for step in range(len(per_rank[0])):
        total = sum(records[step]["loss"] for records in per_rank)
        for records in per_rank:
            records[step]["loss"] = total
    return per_rank


def _gradient_hint(first, world_size: int, guess_unaveraged: bool) -> str:
    """A guess at the mistake behind the first wrong gradient, from the ratio got / expected."""
    if first.kind != "grad" or not first.expected:
        return ""
    ratio = first.got / first.expected
    if abs(ratio - world_size) < 1e-3 * world_size:
        return " (it is the *sum* over ranks: divide by the world size)"
    if guess_unaveraged and world_size > 1 and abs(ratio * world_size - 1) > 1e-3 and abs(ratio - 1) > 1e-3:
        return " (did this rank keep its own gradient? every gradient must be averaged)"
    return ""


def _moved_weights(results) -> str:
    """Hooks that changed the parameters themselves during backward: say so (it explains every later mismatch)."""
    moved = sorted({name for r in results if len(r) > 2 for name in r[2]})
    if not moved:
        return ""
    return (f" — your hooks changed the parameters during loss.backward() ({', '.join(moved[:3])}"
            f"{', …' if len(moved) > 3 else ''}): average each parameter's gradient p.grad, not its weights p.data")


def _judge_training(case, results, guess_unaveraged: bool) -> str | None:
    """None if a case's training equals one process on the same global batches, else what differs first."""
    name, freeze, world_size, steps, global_batch = case
    report = compare(_reference(name, freeze, steps, global_batch), _global_losses([r[0] for r in results]))
    if report.ok:
        return None
    hint = _moved_weights(results) or _gradient_hint(report.first, world_size, guess_unaveraged)
    return f"{_case_name(case)}: {report.first}{hint}"


def _case_name(case) -> str:
    """``mlp with layers.1.bias frozen, world size 3``."""
    name, freeze, world_size = case[:3]
    return f"{name}{' with ' + ', '.join(freeze) + ' frozen' if freeze else ''}, world size {world_size}"


def _score_training(ctx, rank_fn, learner_fn, cases, guess_unaveraged: bool = True) -> float:
    """Train each case on real ranks and compare with one process on the same global batches.

    A case is ``(model name, frozen parameters, world size, steps, global batch)``;
    credit per case that matches. ``rank_fn(rank, world_size, learner_fn, *case)``
    returns ``(records, ...)``; a crash in one case costs only that case. Cases
    with one rank are preconditions: there a sum and a mean agree, so they earn nothing.
    """
    outcomes = []
    for case in cases:
        name, freeze, world_size, steps, global_batch = case
        results = ctx.launch_case(rank_fn, world_size, learner_fn, name, freeze, steps, global_batch)
        if isinstance(results, grading.CheckFailed):
            outcomes.append((world_size, f"{_case_name(case)}: {results}"))
        else:
            outcomes.append((world_size, _judge_training(case, results, guess_unaveraged)))
    return grading.partial_credit([o for g, o in outcomes if g > 1], [o for g, o in outcomes if g == 1])


# Elements a ring collective moves per step, all ranks together, for Ψ gradient elements on G ranks.
_RING_TRAFFIC = {"all-reduce": (2, "2·(G−1)·Ψ"), "reduce-scatter": (1, "(G−1)·Ψ")}


def _counted_traffic(ctx, rank_fn, learner_fn, world_size: int, steps: int, collective: str,
                     silent: str) -> tuple[comm.Traffic, int]:
    """Train the MLP on real ranks; fail unless the learner's code sent what one ring ``collective`` per step moves.

    Traffic is scored only when the training is right: the same number of
    elements moved for a wrong answer earns nothing. ``silent`` is the feedback
    when nothing went through ``coursekit.comm``. Returns the traffic and Ψ.
    """
    case = ("mlp", (), world_size, steps, 12)
    results = ctx.launch(rank_fn, world_size, learner_fn, *case[:2], *case[3:])
    traffic = comm.Traffic.merge([r[1] for r in results])
    if traffic.total == 0:
        raise grading.CheckFailed(silent)
    wrong = _judge_training(case, results, guess_unaveraged=collective == "all-reduce")
    if wrong:
        raise grading.CheckFailed(f"{wrong}\nthe result is wrong (see the check above): traffic is scored only "
                                  f"for a right one")
    psi = sum(p.numel() for p in tiny_mlp().parameters())
    factor, formula = _RING_TRAFFIC[collective]
    per_step = factor * (world_size - 1) * psi
    if traffic.total != steps * per_step:
        doubled = collective == "reduce-scatter" and traffic.total == 2 * steps * per_step
        raise grading.CheckFailed(
            f"{traffic.total / (steps * per_step):.3g}× the traffic of a ring {collective} ({traffic.total} elements "
            f"in {steps} step{'s' if steps > 1 else ''}; {formula} = {per_step} per step)"
            + (" — an all-reduce then a slice moves 2×: use the reduce-scatter alone" if doubled else ""))
    return traffic, psi


# ----------------------------------------------------------------------------- part 1
def _hooks_rank(rank, world_size, attach, name, freeze, steps, global_batch):
    model, data, make_opt = _setup(name, freeze)
    attach(model)
    optimizer = make_opt([p for p in model.parameters() if p.requires_grad])
    records, during, moved = [], comm.Traffic(), set()
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step, global_batch), rank, world_size)
        optimizer.zero_grad(set_to_none=True)
        output = model(x)
        loss = loss_fn(output, y) * weight
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        with comm.record() as traffic:
            loss.backward()
        during.transfers += traffic.transfers
        moved |= {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        records.append(record_step(output, loss.item() / world_size, grads, model))  # summed over ranks below
    return records, during, sorted(moved)


@grading.check(EXERCISE, points=3, timeout=60)
def hooks_average_gradients(submission, ctx):
    """After backward every gradient is the average over ranks: equal to one process (G = 2, 3; G = 1 must work too)."""
    return _score_training(ctx, _hooks_rank, submission.attach_gradient_averaging,
                           [("mlp", (), 1, 3, 12), ("mlp", (), 2, 3, 12), ("mlp", (), 3, 3, 12)])


@grading.check(EXERCISE, points=2, timeout=60)
def hooks_traffic(submission, ctx):
    """Each gradient goes through the ring once, during backward: exactly 2·(G−1)·Ψ elements per step, each rank
    sending a ring's share, about 2·(G−1)·Ψ/G (G = 3)."""
    world_size, steps = 3, 2
    traffic, psi = _counted_traffic(ctx, _hooks_rank, submission.attach_gradient_averaging, world_size, steps,
                                    "all-reduce", "nothing went through coursekit.comm during loss.backward(): "
                                    "register hooks (param.register_post_accumulate_grad_hook) that call "
                                    "ring_all_reduce")
    # The total alone does not tell a ring: a parameter server (master_all_reduce) moves 2·(G−1)·Ψ too, all of it
    # through its root. In a ring all-reduce of n elements a rank sends 2·n minus two of its G segments
    # (ring_traffic); whether the hooks reduce each parameter alone or several flattened together, every
    # rank's load therefore lies between these bounds.
    sizes = [p.numel() for p in tiny_mlp().parameters()]
    low = steps * sum(2 * n - 2 * -(-n // world_size) for n in sizes)
    high = steps * sum(2 * n - 2 * (n // world_size) for n in sizes)
    sent = {r: traffic.sent.get(r, 0) for r in range(world_size)}
    if all(low <= elements <= high for elements in sent.values()):
        return
    busiest = max(sent, key=sent.get)
    said = (f"per-rank sends {sent} in {steps} steps; in a ring every rank sends its share, between {low} and "
            f"{high} (about 2·(G−1)·Ψ/G = {2 * (world_size - 1) * psi // world_size} per step)")
    if sent[busiest] > high:
        raise grading.CheckFailed(f"{said}: rank {busiest} sent {sent[busiest]}, so the gradients funnel through "
                                  f"one rank, as through a master (a parameter server, master_all_reduce); use "
                                  f"ring_all_reduce, where each rank sends only to its neighbour")
    raise grading.CheckFailed(f"{said}: use ring_all_reduce on every gradient")


def _micro_batches(inputs, targets, weight):
    """A rank's shard as two micro-batches, each weighted by its share: the two losses add up to the shard's."""
    parts = list(zip(inputs.tensor_split(2), targets.tensor_split(2)))
    return [(x, y, weight * x.shape[0] / inputs.shape[0]) for x, y in parts]


def _accumulation_rank(rank, world_size, attach, name, freeze, steps, global_batch):
    """Gradient accumulation: two micro-batches per rank, two ``loss.backward()`` before each optimiser step."""
    model, data, make_opt = _setup(name, freeze)
    attach(model)
    optimizer = make_opt([p for p in model.parameters() if p.requires_grad])
    records, moved = [], set()
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step, global_batch), rank, world_size)
        optimizer.zero_grad(set_to_none=True)
        outputs, total = [], 0.0
        for micro_x, micro_y, micro_weight in _micro_batches(x, y, weight):
            output = model(micro_x)
            loss = loss_fn(output, micro_y) * micro_weight
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            loss.backward()                                 # accumulates into p.grad; the hooks run each time
            moved |= {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
            outputs.append(output.detach())
            total += loss.item()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        records.append(record_step(torch.cat(outputs), total / world_size, grads, model))
    return records, None, sorted(moved)


@functools.lru_cache(maxsize=8)
def _micro_batch_means(name, freeze, world_size, global_batch):
    """Step 0's gradient of each micro-batch, averaged over the ranks (one process): the two parts of the answer."""
    model, data, _ = _setup(name, freeze)
    inputs, targets = data.batch(0, global_batch)
    means = []
    for micro in range(2):
        model.zero_grad(set_to_none=True)
        for rank in range(world_size):
            x, y, weight = _micro_batches(*shard_batch(inputs, targets, rank, world_size))[micro]
            (loss_fn(model(x), y) * weight / world_size).backward()
        means.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
    return means


def _accumulation_hint(case, results) -> str:
    """Which multiples of the two micro-batches' averaged gradients the learner's step-0 gradient is, if any.

    After two backward calls the gradient must be 1 × (first micro-batch's average) + 1 × (second's);
    fitting ``got ≈ a·first + b·second`` names the usual mistakes: a = 0 (the hook replaced ``p.grad``
    with this backward's average), a = 1/G (the first share divided twice), b = G (a sum, not a mean).
    """
    name, freeze, world_size, _, global_batch = case
    first, second = _micro_batch_means(name, freeze, world_size, global_batch)
    got = results[0][0][0]["grads"]
    names = [n for n in first if n in got and got[n].shape == first[n].shape]
    if len(names) != len(first):
        return ""
    m1, m2, g = (torch.cat([t[n].reshape(-1).double() for n in names]) for t in (first, second, got))
    solution = torch.linalg.lstsq(torch.stack([m1, m2], 1), g.unsqueeze(1)).solution.reshape(-1)
    a, b = solution.tolist()
    if (torch.stack([m1, m2], 1) @ solution - g).norm() > 1e-3 * g.norm().clamp_min(1e-12):
        return ""                                      # not a combination of the two: nothing to say
    near = lambda value, target: abs(value - target) <= 1e-3 * max(1.0, abs(target))  # noqa: E731
    if near(a, 1) and near(b, 1):
        return ""
    nice = lambda value: f"{0.0 if abs(value) < 1e-6 else value:.3g}"  # noqa: E731  (rounding noise is 0)
    said = (f" (after the two backward calls of step 0 your gradient is {nice(a)} × the first micro-batch's "
            f"average + {nice(b)} × the second's; expected 1 × + 1 ×")
    if near(a, 0) and near(b, 1):
        return (said + ": your hook replaced p.grad with the average of this backward's gradient, discarding "
                       "what the first backward had accumulated — average the accumulated p.grad in place)")
    if near(a, 1 / world_size) and near(b, 1):
        return said + ": the first micro-batch's share was divided by the world size twice)"
    if world_size > 1 and near(b, world_size):  # (a = G²: the first share summed on both backward calls)
        return said + ": it is the *sum* over ranks: divide by the world size)"
    return said + ")"


@grading.check(EXERCISE, points=2, timeout=60)
def hooks_gradient_accumulation(submission, ctx):
    """Gradient accumulation: two micro-batches per rank, two ``loss.backward()`` calls before each step, equal
    to one process on the whole batch (G = 2, 3)."""
    outcomes = []
    for case in [("mlp", (), 2, 2, 12), ("mlp", (), 3, 2, 12)]:
        name, freeze, world_size, steps, global_batch = case
        results = ctx.launch_case(_accumulation_rank, world_size, submission.attach_gradient_averaging,
                                  name, freeze, steps, global_batch)
        if isinstance(results, grading.CheckFailed):
            outcomes.append(f"{_case_name(case)}, two backward calls per step: {results}")
            continue
        report = compare(_reference(name, freeze, steps, global_batch), _global_losses([r[0] for r in results]))
        if report.ok:
            outcomes.append(None)
            continue
        hint = _moved_weights(results) or _accumulation_hint(case, results) or _gradient_hint(
            report.first, world_size, guess_unaveraged=True)
        outcomes.append(f"{_case_name(case)}, two backward calls per step: {report.first}{hint}")
    return grading.partial_credit(outcomes)


@grading.check(EXERCISE, points=1, hidden=True, timeout=60)
def hooks_tied_frozen_uneven(submission, ctx):
    """Transformer with a tied head and a frozen parameter, a global batch of 7 on 3 and 4 ranks."""
    return _score_training(ctx, _hooks_rank, submission.attach_gradient_averaging,
                           [("transformer", ("pos_emb.weight",), 3, 2, 7),
                            ("transformer", ("pos_emb.weight",), 4, 2, 7)])


# ----------------------------------------------------------------------------- part 2
def _zero2_rank(rank, world_size, reduce_scatter_gradients, name, freeze, steps, global_batch):
    """A whole ZeRO-2 training loop around the learner's reduce-scatter."""
    model, data, make_opt = _setup(name, freeze)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    layout = [(n, tuple(p.shape)) for n, p in named]
    numel = sum(p.numel() for _, p in named)
    start, stop = segment_bounds(numel, world_size)[owned_segment(rank, world_size)]
    flat = torch.cat([p.detach().reshape(-1) for _, p in named])
    offset = 0
    for _, p in named:  # parameters become views into one flat buffer
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    shard = torch.nn.Parameter(flat[start:stop])
    optimizer = make_opt([shard])
    records, traffic_per_step, still_held = [], [], []
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step, global_batch), rank, world_size)
        output = model(x)
        loss = loss_fn(output, y) * weight
        loss.backward()
        with comm.record() as traffic:
            try:
                mine = reduce_scatter_gradients(model)
            except AttributeError as error:
                if "NoneType" not in str(error) or not any(not p.requires_grad for p in model.parameters()):
                    raise
                raise AttributeError(f"{error}: a frozen parameter (requires_grad=False) has no gradient, p.grad is "
                                     f"None: flatten only the trainable parameters") from None
        traffic_per_step.append(traffic)
        if not isinstance(mine, torch.Tensor):
            raise TypeError(f"reduce_scatter_gradients returned {type(mine).__name__}, expected a tensor")
        # What stays allocated: the p.grad not freed, and the storage behind the returned segment (a view into
        # the flat buffer of every gradient keeps all of it alive).
        still_held.append({"grads": sum(p.grad.numel() for _, p in named if p.grad is not None),
                           "returned": mine.numel(),
                           "storage": mine.untyped_storage().nbytes() // mine.element_size()})
        mine = mine.detach().reshape(-1)
        if mine.numel() != stop - start:
            everything = sum(p.numel() for p in model.parameters())
            a, b = segment_bounds(everything, world_size)[owned_segment(rank, world_size)]
            frozen = (f" — that is its segment of all {everything} parameters, frozen ones included: flatten only "
                      f"those with requires_grad") if everything != numel and mine.numel() == b - a else ""
            raise ValueError(f"rank {rank} returned {mine.numel()} elements; it owns segment "
                             f"{owned_segment(rank, world_size)} = elements {start}:{stop} ({stop - start}) "
                             f"of the {numel} flattened gradients of the trainable parameters{frozen}")
        shard.grad = mine.clone()
        optimizer.step()
        ring_all_gather(flat[start:stop], flat)  # (not counted: outside the recorded block)
        for _, p in named:
            p.grad = None
        frozen = {n: p.data for n, p in model.named_parameters() if not p.requires_grad}
        records.append(record_step(output, loss.item() / world_size, FlatShard(layout, start, shard.grad),
                                   FlatShard(layout, start, shard.data, frozen)))
    return records, comm.Traffic.merge(traffic_per_step), (), still_held  # () : no weights moved during backward


@grading.check(EXERCISE, points=3, timeout=60)
def zero2_segment(submission, ctx):
    """Each rank gets the averaged gradient of its own segment; ZeRO-2 training equals one process (G = 2–4, and
    G = 3 with a frozen parameter; G = 1 must work too)."""
    return _score_training(ctx, _zero2_rank, submission.reduce_scatter_gradients,
                           [("mlp", (), 1, 2, 12), ("mlp", (), 2, 2, 12), ("mlp", (), 3, 2, 12), ("mlp", (), 4, 2, 12),
                            ("mlp", (FROZEN,), 3, 2, 12)], guess_unaveraged=False)


@grading.check(EXERCISE, points=2, timeout=60)
def zero2_traffic(submission, ctx):
    """A reduce-scatter, not an all-reduce: exactly (G−1)·Ψ elements per step, each rank N − its segment (G = 4)."""
    world_size = 4
    traffic, psi = _counted_traffic(ctx, _zero2_rank, submission.reduce_scatter_gradients, world_size, 1,
                                    "reduce-scatter", "nothing went through coursekit.comm: use chapter 01's "
                                    "ring_reduce_scatter (coursekit.collectives) on the flattened gradients")
    bounds = segment_bounds(psi, world_size)
    want = {r: psi - (lambda b: b[1] - b[0])(bounds[owned_segment(r, world_size)]) for r in range(world_size)}
    if traffic.sent != want:
        raise grading.CheckFailed(f"per-rank sends {traffic.sent}, expected {want}: one ring reduce-scatter over "
                                  f"all the gradients flattened together")


@grading.check(EXERCISE, points=1, timeout=60)
def zero2_frees_gradients(submission, ctx):
    """After the reduce-scatter a rank keeps only its segment: every ``p.grad`` is freed, and the segment returned
    is a tensor of its own, not a view into the flattened gradients (G = 2)."""
    results = ctx.launch(_zero2_rank, 2, submission.reduce_scatter_gradients, "mlp", (), 1, 12)
    memory = [r[3][0] for r in results]
    problems = []
    held = max(m["grads"] for m in memory)
    if held:
        problems.append(f"{held} gradient elements are still held in p.grad after the reduce-scatter: "
                        f"set p.grad = None (that is the memory ZeRO-2 saves)")
    views = [(rank, m) for rank, m in enumerate(memory) if m["storage"] > m["returned"]]
    if views:
        rank, m = views[0]
        psi = sum(p.numel() for p in tiny_mlp().parameters())
        buffer = f"the flat buffer of all {psi} flattened gradients" if m["storage"] == psi else \
            f"a buffer of {m['storage']} elements"
        problems.append(f"rank {rank} returned its segment ({m['returned']} elements) as a view into {buffer}: "
                        f"as long as the segment lives, so does the whole buffer, and ZeRO-2 saves nothing. Return "
                        f"a tensor of its own: mine / world_size (or .clone()), not mine.div_(world_size)")
    if problems:
        raise grading.CheckFailed("\n".join(problems))


@grading.check(EXERCISE, points=1, hidden=True, timeout=90)
def zero2_hidden_variants(submission, ctx):
    """Transformer (tied head, frozen parameter), Ψ not divisible by G, a global batch of 7 on 5 ranks."""
    return _score_training(ctx, _zero2_rank, submission.reduce_scatter_gradients,
                           [("transformer", ("pos_emb.weight",), 5, 2, 7), ("transformer", (), 3, 2, 7)],
                           guess_unaveraged=False)
