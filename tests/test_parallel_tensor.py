"""Tensor parallelism (Megatron-LM) equals the dense course transformer: outputs, loss, every gradient
reassembled from the shards, parameters after optimizer steps; communication counted against the formula."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

import coursekit
from coursekit.comm.mesh import Mesh, rank_size
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel.tensor import (count_communication, expected_counts, gather_dense, parallelize_transformer,
                                       shard_sizes, split_to_parallel_region, vocab_parallel_cross_entropy)
from coursekit.train import train
from coursekit.measure.verify import compare

TIMEOUT = 240.0
BATCH, STEPS = 3, 3
MODELS = {  # name: tiny_transformer arguments; neither vocabulary divides every degree, heads 6 do not divide 4
    "vocab 16, 4 heads": dict(vocab_size=16, d_model=64, n_heads=4, n_layers=2),
    "vocab 13, 6 heads": dict(vocab_size=13, d_model=48, n_heads=6, n_layers=1),
}


def _dense(config):
    """The course transformer with every weight random, biases and norms included (zero biases hide bias bugs)."""
    model = tiny_transformer(seed=0, **config)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model


def _batch(config, step):
    data = LanguageData(vocab_size=config["vocab_size"], seq_len=9, seed=1)
    return data.batch(step, BATCH)


def _diffs(expected: dict, got: dict) -> dict:
    return {name: (got[name] - t).abs().max().item() if name in got else float("inf") for name, t in expected.items()}


def _tp_groups(world_size):
    """{degree: this rank's tensor-parallel group, or None if it sits this degree out} (3: ranks 0-2 only)."""
    groups = {d: Mesh({"dp": world_size // d, "tp": d})["tp"] for d in (1, 2, 4)}
    three = dist.new_group([0, 1, 2])
    groups[3] = three if dist.get_rank() < 3 else None
    return groups


def _against_dense(rank, world_size):
    results = {}
    for degree, group in _tp_groups(world_size).items():
        if group is None:
            continue
        for name, config in MODELS.items():
            dense = _dense(config)
            tp = parallelize_transformer(_dense(config), group)
            x, y = _batch(config, 0)
            with count_communication() as counts:
                loss = tp.loss(x, y)
                loss.backward()
            logits = tp.full_logits(x).detach()
            expected_logits = dense(x)
            expected_loss = loss_fn(expected_logits, y)
            expected_loss.backward()
            r = {"logits": (logits - expected_logits).abs().max().item(),
                 "loss": abs(loss.item() - expected_loss.item()),
                 "grads": _diffs({n: p.grad for n, p in dense.named_parameters()}, gather_dense(tp, grads=True)),
                 "calls": dict(counts.calls), "elements": dict(counts.elements)}
            tp_opt = torch.optim.SGD(tp.parameters(), lr=0.1, momentum=0.9)
            dense_opt = torch.optim.SGD(dense.parameters(), lr=0.1, momentum=0.9)
            for step in range(STEPS):  # step 0's gradients are already there
                if step:
                    x, y = _batch(config, step)
                    for model, opt in ((tp, tp_opt), (dense, dense_opt)):
                        opt.zero_grad()
                    tp.loss(x, y).backward()
                    loss_fn(dense(x), y).backward()
                tp_opt.step()
                dense_opt.step()
            r["params"] = _diffs(dict(dense.named_parameters()), gather_dense(tp))
            results[degree, name] = r
    return results


def test_tensor_parallel_transformer_equals_dense_at_degrees_1_to_4():
    """Degrees 1, 2, 4 and 3 (uneven: vocabulary 16 -> 6, 5, 5 rows; 4 heads -> 2, 1, 1; at degree 4 six heads
    -> 2, 2, 1, 1 and vocabulary 13 -> 4, 3, 3, 3). Logits, the vocabulary-parallel loss, every gradient
    reassembled from the shards, the parameters after 3 SGD steps, and the collectives counted.

    Planted bugs, each seen failing here: f's backward all-reduce forgotten (gradients of the norms and
    the embeddings off; backward count 0); the row-parallel bias added on every rank (logits off);
    qkv sharded as one block of its 3·d rows (logits off); the loss's max all-reduce skipped (loss off);
    uneven sizes split as V // t rows each (a silently smaller vocabulary: gather fails / loss off)."""
    results = coursekit.launch(_against_dense, 4, timeout=TIMEOUT)
    checked = set()
    for rank, per_rank in enumerate(results):
        for (degree, name), r in per_rank.items():
            where = f"degree {degree}, {name}, rank {rank}"
            checked.add(degree)
            assert r["logits"] < 1e-4, f"{where}: logits differ from the dense model's by {r['logits']:.3g}"
            assert r["loss"] < 1e-5, f"{where}: vocabulary-parallel loss is {r['loss']:.3g} off F.cross_entropy"
            for kind in ("grads", "params"):
                bad = sorted(((d, n) for n, d in r[kind].items() if not d < 1e-5), reverse=True)
                assert not bad, (f"{where}: {len(bad)} of {len(r[kind])} {kind} differ from the dense model's, "
                                 f"worst {', '.join(f'{n} by {d:.3g}' for d, n in bad[:3])}")
            # The formula: per layer 2 all-reduces of b·s·h forward (attention's and the MLP's g) and 2
            # backward (their f); the embedding's g forward, the tied head's f backward; the loss's 3 of b·s.
            config = MODELS[name]
            bs, layers = BATCH * 8, config["n_layers"]
            bsh = bs * config["d_model"]
            if degree == 1:
                expected_calls, expected_elements = {}, {}
            else:
                expected_calls = {("all_reduce", "forward"): 2 * layers + 1 + 3,
                                  ("all_reduce", "backward"): 2 * layers + 1}
                expected_elements = {("all_reduce", "forward"): (2 * layers + 1) * bsh + 3 * bs,
                                     ("all_reduce", "backward"): (2 * layers + 1) * bsh}
            assert r["calls"] == expected_calls, f"{where}: collectives issued {r['calls']}, formula {expected_calls}"
            library = expected_counts(BATCH, 8, config["d_model"], layers, degree)  # what the chapter prints
            assert (dict(library.calls), dict(library.elements)) == (expected_calls, expected_elements)
            assert r["elements"] == expected_elements, \
                f"{where}: elements moved {r['elements']}, formula {expected_elements}"
    assert checked == {1, 2, 3, 4}


def _loss_alone(rank, world_size):
    """Random logits over a vocabulary of 13 (divides neither 2 nor 4), targets in every rank's rows."""
    results = {}
    for degree, group in _tp_groups(world_size).items():
        if group is None:
            continue
        generator = torch.Generator().manual_seed(11)
        full = (torch.randn(40, 13, generator=generator) * 20).requires_grad_(True)
        targets = torch.arange(40) % 13
        expected = F.cross_entropy(full, targets, reduction="none")
        expected.sum().backward()
        sizes, me = shard_sizes(13, degree), rank_size(group)[0]
        start = sum(sizes[:me])
        local = full.detach()[:, start:start + sizes[me]].clone().requires_grad_(True)
        loss = vocab_parallel_cross_entropy(local, targets, start, group)
        loss.sum().backward()
        results[degree] = ((loss - expected).abs().max().item(),
                           (local.grad - full.grad[:, start:start + sizes[me]]).abs().max().item())
    return results


def test_vocab_parallel_cross_entropy_equals_cross_entropy_on_the_whole_logits():
    """Per position, and the gradient of this rank's logits, with logits up to ~60 (exp overflows float32
    without the shift). Planted bugs, each seen failing here: the row max not all-reduced (each rank shifts by
    its own max: the sum of exponentials mixes scales); the target logit summed without masking the ranks that
    do not own the target."""
    for rank, per_rank in enumerate(coursekit.launch(_loss_alone, 4, timeout=TIMEOUT)):
        for degree, (loss_diff, grad_diff) in per_rank.items():
            assert loss_diff < 1e-4, f"degree {degree}, rank {rank}: loss is {loss_diff:.3g} off F.cross_entropy"
            assert grad_diff < 1e-6, f"degree {degree}, rank {rank}: gradient of the logits differs by {grad_diff:.3g}"


def _layers_alone(rank, world_size):
    """Column-parallel with its output gathered, then row-parallel splitting a whole input: two dense layers."""
    from coursekit.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    results = {}
    for degree, group in _tp_groups(world_size).items():
        if group is None:
            continue
        generator = torch.Generator().manual_seed(2)
        first, second = torch.nn.Linear(5, 7), torch.nn.Linear(7, 4)  # 7 features: uneven at 2, 3 and 4
        with torch.no_grad():
            for p in (*first.parameters(), *second.parameters()):
                p.copy_(torch.randn(p.shape, generator=generator))
        x = torch.randn(6, 5, generator=generator)
        column = ColumnParallelLinear.from_dense(first, group, gather_output=True)
        row = RowParallelLinear.from_dense(second, group, input_is_parallel=False)
        inputs = x.clone().requires_grad_(True)
        with count_communication() as counts:
            y = row(column(inputs))
            y.sum().backward()
        dense_inputs = x.clone().requires_grad_(True)
        second(first(dense_inputs)).sum().backward()
        grads = {**{f"first.{n}": p.grad for n, p in first.named_parameters()},
                 **{f"second.{n}": p.grad for n, p in second.named_parameters()}}
        got = {**{f"first.{n}": t for n, t in gather_dense(column, grads=True, group=group).items()},
               **{f"second.{n}": t for n, t in gather_dense(row, grads=True, group=group).items()}}
        alone = x.clone().requires_grad_(True)
        split_to_parallel_region(alone, -1, group).pow(2).sum().backward()  # every rank squares its slice
        results[degree] = {"split grad": (alone.grad - 2 * x).abs().max().item(),
                           "output": (y - second(first(x))).abs().max().item(),
                           "input grad": (inputs.grad - dense_inputs.grad).abs().max().item(),
                           "grads": _diffs(grads, got), "calls": dict(counts.calls)}
    return results


def test_column_gathered_then_row_split_equal_two_dense_layers():
    """gather_from_parallel_region after the column-parallel layer (all-gather forward, slice backward) and
    split_to_parallel_region before the row-parallel one (slice forward, all-gather backward), uneven features.
    Planted bug, seen failing here: the split's backward zero-fills the other ranks' slices instead of gathering
    them (split alone: the gradient misses the other ranks' features; after the gather, whose backward keeps
    this rank's slice anyway, only the missing backward all-gather in the count shows it)."""
    for rank, per_rank in enumerate(coursekit.launch(_layers_alone, 4, timeout=TIMEOUT)):
        for degree, r in per_rank.items():
            where = f"degree {degree}, rank {rank}"
            assert r["output"] < 1e-5, f"{where}: output differs by {r['output']:.3g}"
            assert r["input grad"] < 1e-5, f"{where}: input gradient differs by {r['input grad']:.3g}"
            bad = {n: d for n, d in r["grads"].items() if not d < 1e-5}
            assert not bad, f"{where}: gradients differ: {bad}"
            assert r["split grad"] < 1e-6, f"{where}: split's backward left {r['split grad']:.3g} of the gradient out"
            each_way = {} if degree == 1 else {(op, d): 1 for op in ("all_reduce", "all_gather")
                                               for d in ("forward", "backward")}
            assert r["calls"] == each_way, f"{where}: collectives {r['calls']}, expected {each_way}"


def _too_small(rank, world_size):
    errors = []
    for config in (dict(vocab_size=3), dict(n_heads=2)):  # degree 4 > 3 vocabulary rows; > 2 heads
        try:
            parallelize_transformer(tiny_transformer(seed=0, **config), None)
            errors.append("no error")
        except ValueError as error:
            errors.append(str(error))
    try:
        train(rank, world_size, "dp_tp", model="transformer", steps=1, tp=3)
        errors.append("no error")
    except ValueError as error:
        errors.append(str(error))
    return errors


def test_a_degree_larger_than_a_size_is_rejected_naming_both():
    """Planted bug, seen failing here ("no error"): no check, so degree 4 gives one rank no vocabulary row."""
    vocab, heads, mesh = coursekit.launch(_too_small, 4, timeout=TIMEOUT)[0]
    assert "vocabulary 3" in vocab and "degree of 4" in vocab and "at most 3" in vocab, vocab
    assert "n_heads 2" in heads and "degree of 4" in heads and "at most 2" in heads, heads
    assert "tp=3" in mesh and "world size 4" in mesh, mesh


# SGD, not Adam: where a gradient is zero to rounding, Adam's first step lr·g/(|g| + eps) turns its last bits into an
# update of up to lr (lr/eps = 1e5 times the gradient's difference). One process's "tensor" strategy multiplies in
# other shapes than "single", so under AVX2 kernels blocks.1.fc.weight[75, 36] moved 1.09e-05 apart (the fp32
# tolerance is 1e-05) while every gradient agreed to 4e-07. SGD with momentum moves each weight by lr times its
# gradients: their agreement, scaled by lr.
CONFIG = dict(model="transformer", steps=3, global_batch=7, optimizer="sgd", lr=0.1)


def _train(rank, world_size, strategy, options):
    result = train(rank, world_size, strategy, **CONFIG, trace=strategy == "tensor", **options)
    counters = {k: v for k, v in result.items() if k.startswith("tp_") or k == "elements_reduced"}
    if result["spans"] is not None:  # the collectives drawn on the timeline, as counted
        counters["spans"] = sum(1 for s in result["spans"] if s.kind == "comm" and s.rank == rank)
    return result["records"], counters


def test_strategies_train_like_one_process():
    """"tensor" at degrees 1 (in this process), 2 and 3 (uneven), and "dp_tp" on a 2 x 2 mesh with a global
    batch of 7 (4 + 3 per data slice): outputs, loss, gradients and parameters after 3 SGD steps equal
    strategy="single" on the same global batch; collectives per step as the formula and expected_counts (the
    loop's loss vocabulary-parallel through Strategy.loss: 3 all-reduces of b·s, the logits never gathered in
    training), each one a comm span on the traced timeline; the dp gradient elements as the formula.
    Planted bugs, each seen failing here: the hybrid's gradients all-reduced over the tp axis instead of dp
    (each data slice then trains on its half of the batch: gradients off at step 0); the tracer not handed to
    the counter (no comm span); the logits gathered anyway (forward returning full_logits, loss on whole
    logits: one all-gather of b·s·V per step counted, 3 loss all-reduces missing)."""
    reference = train(0, 1, "single", **CONFIG)["records"]
    single_tp = train(0, 1, "tensor", **CONFIG)["records"]
    assert compare(reference, [single_tp]).ok, compare(reference, [single_tp])
    h, layers, vocab, seq = 64, 2, 16, 31
    for world_size, strategy, options in ((2, "tensor", {}), (3, "tensor", {}), (4, "dp_tp", {"tp": 2})):
        results = coursekit.launch(_train, world_size, strategy, options, timeout=TIMEOUT)
        records = [r[0] for r in results]
        # every rank of a tensor group records its data slice's whole output: one rank per slice, in dp order
        slices = [records[0]] if strategy == "tensor" else [records[0], records[2]]
        for report in (compare(reference, slices), compare(reference, records, check_output=False)):
            assert report.ok, f"{strategy} on {world_size} ranks: {report}"
        for rank, (_, counters) in enumerate(results):
            batch = 7 if strategy == "tensor" else (4, 3)[rank // 2]
            bsh = batch * seq * h
            # the vocabulary-parallel loss: 3 all-reduces of b·s forward, and no all-gather of the b·s·V logits
            expected = {"tp_all_reduce_forward_calls": CONFIG["steps"] * (2 * layers + 1 + 3),
                        "tp_all_reduce_forward_elements": CONFIG["steps"] * ((2 * layers + 1) * bsh + 3 * batch * seq),
                        "tp_all_reduce_backward_calls": CONFIG["steps"] * (2 * layers + 1),
                        "tp_all_reduce_backward_elements": CONFIG["steps"] * (2 * layers + 1) * bsh,
                        "tp_all_gather_forward_calls": 0, "tp_all_gather_forward_elements": 0,
                        "tp_all_gather_backward_calls": 0, "tp_all_gather_backward_elements": 0}
            per_step = expected_counts(batch, seq, h, layers, 2).as_dict()  # what the chapter prints
            assert {k: CONFIG["steps"] * v for k, v in per_step.items()} == expected, per_step
            if strategy == "dp_tp":  # every step, each rank all-reduces its local gradients over dp once
                replicated = 64 * 64 + layers * (2 * 2 * h + 2 * h) + 2 * h  # pos_emb; 2 norms, 2 row biases; ln_f
                split = vocab * h + layers * (3 * h * h + h * h + 4 * h * h + 4 * h + 4 * h * h)
                expected["elements_reduced"] = CONFIG["steps"] * (replicated + split // 2)
            if strategy == "tensor":  # traced: one comm span per collective
                expected["spans"] = CONFIG["steps"] * (2 * (2 * layers + 1) + 3)
            got = {k: counters[k] for k in expected}
            assert got == expected, f"{strategy} on {world_size} ranks, rank {rank}: counted {got}, formula {expected}"
