"""The cost model against what is measured (issue 27, section 2): model states, chapters 02-05; activations, 04-06.

Model states: the course transformer (104,832 parameters, fp32 Adam) trained one step, measured by
``coursekit.measure.memory.PeakMemory`` inside ``coursekit.train.train`` (storage actually allocated). Activations:
what autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``, each storage once): chapter
04's executor records it per (stage, micro-batch); for chapter 05's block and Korthikanti et al.'s own layer
(built here) the tests count it.

Seen failing (planted in coursekit.costmodel.memory, reverted): fp32's optimizer state 8 -> 12 bytes
("naive on 2 ranks, rank 0: optimizer 838760 != 1257984 + Adam's step counters 104"); ZeRO-2 not dividing
the gradients ("zero2 on 2 ranks, rank 0: grads 209664 != 419328"); ZeRO-3's live layer without its
gradients ("zero3 on 2 ranks, rank 0: peak params + grads 1257984 != 838656"); tensor parallelism
splitting the norms' and first matmuls' inputs too ("tp = 2, sp False, rank 0: saved 330752, model 262144");
sequence parallelism not splitting them ("tp = 2, sp True, rank 0: saved 264192, model 327680"); the output
layer's inputs 3sbh ("ring, G = 1: [562432], model 573440 + 5376"); memory_per_gpu not dividing by sp.
"""

import pytest
import torch
import torch.nn.functional as F

import coursekit
from coursekit import comm
from coursekit.costmodel import (Layout, ModelConfig, activation_bytes_per_layer, logits_bytes, memory_per_gpu,
                                 model_state_bytes, num_params, params_per_rank, pipeline_activation_bytes)
from coursekit.models import tiny_transformer
from coursekit.parallel.sequence import (SequenceTensorParallelBlock, megatron_sp_saved_bytes, positions, ring_attention,
                                        saved_bytes, sequence_forward, shard_sequence, ulysses_attention)
from coursekit.parallel.tensor import parallelize_transformer
from coursekit.train import train

STRATEGIES = ("naive", "zero1", "zero2", "zero3")
PSI = 104_832                    # tiny_transformer(): counted in tests/test_costmodel_memory.py from numel


def _one_step(rank, world_size):
    return [train(rank, world_size, s, model="transformer", steps=1, global_batch=6, collectives="torch",
                  record=False, **({} if s == "naive" else {"bucket_elements": 10 ** 6})) for s in STRATEGIES]


@pytest.mark.parametrize("world_size", [2, 3])
def test_predicted_model_states_equal_what_chapter_02_holds(world_size):
    """After the step: parameters and gradients exactly; the optimizer exactly but for Adam's 4-byte ``step``
    counter per parameter tensor (one per shard under ZeRO), which the 16Ψ of the ZeRO paper leaves out.

    At the peak (inside the step), what the model adds or leaves out, exactly:
    * ZeRO-3 gathers the *whole* model to compute (chapter 02's ZeRO-3 is not per layer), and each gradient
      exists in full before it is reduce-scattered: ``largest_layer = Ψ`` makes ``live`` = (4 + 4)Ψ, and
      params + grads at their peaks = the model's params + grads + live.
    * ZeRO-2 holds its gradient bucket before reduce-scattering it (here one bucket: 4Ψ); the model's ZeRO-2
      counts the shard only -- as DeepSpeed's estimator, which leaves out its reduce bucket too.
    """
    assert num_params(ModelConfig.course()).total == PSI
    n_tensors = len(list(tiny_transformer().parameters()))
    results = coursekit.launch(_one_step, world_size, timeout=240)
    for rank in range(world_size):
        for stage, (strategy, run) in enumerate(zip(STRATEGIES, results[rank])):
            where = f"{strategy} on {world_size} ranks, rank {rank}"
            predicted = model_state_bytes(PSI, dp=world_size, zero_stage=stage, precision="fp32")
            held = run["memory"]
            assert held["params"] == predicted.params, f"{where}: params {held['params']} != {predicted.params}"
            assert held["grads"] == predicted.grads, f"{where}: grads {held['grads']} != {predicted.grads}"
            counters = 4 * (n_tensors if stage == 0 else 1)
            assert held["optimizer"] == predicted.optimizer + counters, \
                f"{where}: optimizer {held['optimizer']} != {predicted.optimizer} + Adam's step counters {counters}"
            peak = run["peak_memory"]
            if stage == 3:
                live = model_state_bytes(PSI, dp=world_size, zero_stage=3, precision="fp32", largest_layer=PSI)
                measured, modelled = peak["params"] + peak["grads"], live.params + live.grads + live.live
                assert measured == modelled, f"{where}: peak params + grads {measured} != {modelled}"
            elif stage == 2:
                assert peak["grads"] - predicted.grads == 4 * PSI, f"{where}: the one bucket before reduce-scatter"
            else:
                assert (peak["params"], peak["grads"]) == (predicted.params, predicted.grads), where


def _pipeline(rank, world_size):
    keys = ("peak_in_flight", "peak_activation_bytes", "activation_bytes")
    return [{k: run[k] for k in keys} for run in
            (train(rank, world_size, "pipeline", model="transformer", micro_batches=2, schedule=schedule, steps=1,
                   global_batch=8, record=False) for schedule in ("1f1b", "gpipe"))]


def test_predicted_activations_equal_what_chapter_04_holds():
    """Chapter 04's executor measures what autograd saves per (stage, micro-batch) (weak references, each storage
    once, the parameters and the input batch excluded). The course transformer on 2 stages (embedding + block 0 |
    block 1 + ln_f + head + loss), micro-batches of b = 4 sequences of s = 31 tokens, h = 64, a = 4, v = 16, fp32.

    The model: Table 2 at 4 bytes without dropout masks (the course model has no dropout), *selective* -- no
    a·s²·b scores, because PyTorch's CPU scaled_dot_product_attention is flash-style: it keeps the output and
    the log-sum-exp and recomputes the softmax in backward, as selective recomputation does (counting the scores,
    "none", overestimates by 4·a·s²·b = 61,504 bytes, 12%: the softmax output, which no dropout copies). On the last stage the output layer's inputs and the
    logits (:func:`logits_bytes`). Within 2% of what is measured; the rest, exactly, is what Korthikanti et al.
    leave out: LayerNorm's mean and 1/std (2 floats a token a norm), the log-sum-exp (1 float a token a head),
    the position ids (int64) on the first stage, the targets (int64) and NLL's total weight on the last.
    """
    s, b, h, a, v = 31, 4, 64, 4, 16
    tokens = s * b
    block = activation_bytes_per_layer(s, b, h, a, recompute="selective", bytes_per_element=4, dropout=False).total
    per_block_extra = 2 * (2 * tokens * 4) + a * tokens * 4           # two LayerNorms' stats, the log-sum-exp
    model = [block, block + logits_bytes(s, b, h, v, bytes_per_element=4, logits_bytes_per_element=4).total]
    extra = [per_block_extra + 8 * s, per_block_extra + 2 * tokens * 4 + 8 * tokens + 4]   # ln_f's stats, targets
    results = coursekit.launch(_pipeline, 2, timeout=240)
    for schedule_index, schedule in enumerate(("1f1b", "gpipe")):
        for rank in range(2):
            run = results[rank][schedule_index]
            for (stage, micro_batch), measured in run["activation_bytes"].items():
                where = f"{schedule}, stage {stage}, micro-batch {micro_batch}"
                assert measured == pytest.approx(model[stage], rel=0.02), f"{where}: {measured} vs model {model[stage]}"
                assert measured - model[stage] == extra[stage], f"{where}: {measured} - {model[stage]} != {extra[stage]}"
            held = pipeline_activation_bytes(model[rank] + extra[rank], 2, pp=2, micro_batches=2, schedule=schedule,
                                             rank=rank)
            assert run["peak_activation_bytes"] == held.total, f"{schedule}, rank {rank}: {held.in_flight} in flight"
    assert block == 16 * 4 * tokens * h == 507_904, f"{block}: Table 2's 16 elements of s·b·h, 4 bytes each"
    with_scores = activation_bytes_per_layer(s, b, h, a, bytes_per_element=4, dropout=False).total
    assert with_scores - block == 4 * a * s * s * b == 61_504   # the probabilities once: no dropout, no copy


def _model_states(rank, world_size):
    return [train(rank, world_size, s, model="transformer", steps=1, global_batch=4, record=False)["memory"]
            for s in ("model", "pipeline", "tensor")]


def test_params_per_rank_equal_what_chapters_03_to_05_hold():
    """After one fp32 Adam step on 2 ranks: 4 bytes a parameter and a gradient, 8 + Adam's step counters, where
    the parameters are :func:`params_per_rank` of the rank -- exactly.

    * chapters 03 (``"model"``) and 04 (``"pipeline"``), pp = 2: stage 0 the embedding (16·64), the positions
      (64·64) and block 0 (49,792) = 54,912 parameters in 2 + 11 tensors; stage 1 block 1, ln_f (128) and
      the tied head's *copy* (1,024) = 50,944 in 11 + 2 + 1 tensors.
    * chapter 05 (``"tensor"``), tp = 2: the vocabulary-parallel embedding 512, the positions 4,096
      (replicated), each block (12·64² + 4·64)/2 split + 6·64 replicated = 25,088, ln_f 128: 54,912 in all
      26 tensors (every tensor is split or replicated, none is dropped).
    """
    course = ModelConfig.course()
    stages = [params_per_rank(course, pp=2, stage=r).total for r in (0, 1)]
    assert stages == [54_912, 50_944]
    tensor = params_per_rank(course, tp=2).total
    assert tensor == 512 + 4096 + 2 * 25_088 + 128
    tensors = {"model": [13, 14], "pipeline": [13, 14], "tensor": [26, 26]}
    results = coursekit.launch(_model_states, 2, timeout=240)
    for rank in range(2):
        for strategy, held in zip(("model", "pipeline", "tensor"), results[rank]):
            n = tensor if strategy == "tensor" else stages[rank]
            expected = {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n + 4 * tensors[strategy][rank]}
            assert held == expected, f"{strategy}, rank {rank}: held {held}, params_per_rank predicts {expected}"


class KorthikantiLayer(torch.nn.Module):
    """The layer Table 2 counts: pre-norm GPT block, explicit softmax attention (no flash), dropout in three places."""

    def __init__(self, h, a, p=0.1):
        super().__init__()
        self.a, self.p = a, p
        self.ln1, self.qkv, self.proj = torch.nn.LayerNorm(h), torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.ln2, self.fc, self.out = torch.nn.LayerNorm(h), torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (t.reshape(b, s, self.a, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(h, dim=-1))
        probs = F.dropout((q @ k.transpose(-1, -2) * (h // self.a) ** -0.5).softmax(-1), self.p, True)
        x = x + F.dropout(self.proj((probs @ v).transpose(1, 2).reshape(b, s, h)), self.p, True)
        return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)))), self.p, True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_table_2_counted_in_autograd(dtype):
    """Table 2's sbh(34 + 5as/h) is what PyTorch's autograd saves for the paper's layer -- up to two named terms.

    Counted by chapter 06's saved_bytes (s = 32, b = 2, h = 64, a = 4; CPU): the formula at 2 (bf16) or 4 (fp32)
    bytes an element, plus (1) the three dropout masks (2sbh + as²b elements), which PyTorch's CPU kernel stores
    at the activation's dtype, e bytes, where the paper counts 1 byte (CUDA's kernel keeps a bool mask; no GPU
    here to see it), and (2) the two LayerNorms' mean and 1/std, 4·s·b values, which the paper leaves out.
    """
    s, b, h, a = 32, 2, 64, 4
    e = torch.finfo(dtype).bits // 8
    torch.manual_seed(0)
    layer = KorthikantiLayer(h, a).to(dtype)
    with saved_bytes(layer.parameters()) as meter:                  # chapter 06's meter
        layer(torch.randn(b, s, h, dtype=dtype, requires_grad=True))
    measured = meter.bytes
    formula = activation_bytes_per_layer(s, b, h, a, bytes_per_element=e).total
    masks, norm_stats = (e - 1) * (2 * s * b * h + a * s * s * b), 4 * s * b * e
    assert measured == formula + masks + norm_stats, f"{dtype}: autograd saved {measured}, Table 2 {formula}"
    if dtype == torch.bfloat16:
        assert formula == 34 * s * b * h + 5 * a * s * s * b


def _block_saved_bytes(rank, world_size, sequence_parallel, x):
    """What chapter 05's (or 06's Megatron-style) block 0 saves on this rank for a forward of ``x``."""
    if sequence_parallel:
        block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0], seq_len=x.shape[1])
        x = shard_sequence(x, 1, rank, world_size)
    else:
        block = parallelize_transformer(tiny_transformer(seed=0)).blocks[0]
    with saved_bytes(block.parameters()) as meter:
        block(x.clone().requires_grad_())
    return meter.bytes


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_activations_equal_chapters_05_and_06s_blocks(tp, sequence_parallel):
    """Chapter 05's block (column-parallel qkv and fc, row-parallel proj and out, replicated norms) and chapter 06's
    Megatron-style one (the norms' regions split by tokens) on tp ranks: what autograd saves per
    rank = Table 2's rows sbh(10 + 24/t) and sbh(34/t), at 4 bytes without masks and scores (no dropout;
    flash-style CPU attention, as for chapter 04) -- 4 elements of s·b·h whole (tp) or split (tp + sp: both norms'
    inputs, the qkv and fc inputs), 12 split (Q, K, V, the proj input, the GeLU input, the out input) -- plus,
    exactly, the norms' mean and 1/std (4 floats a token, a token of this rank's with sp) and the log-sum-exp of
    this rank's a/t heads. The same as chapter 06's own count, megatron_sp_saved_bytes.
    """
    s, b, h, a = 32, 4, 64, 4
    sbh = s * b * h
    model = activation_bytes_per_layer(s, b, h, a, tp=tp, sequence_parallel=sequence_parallel, recompute="selective",
                                       bytes_per_element=4, dropout=False)
    extra = (4 * s * b // (tp if sequence_parallel else 1) + (a // tp) * s * b) * 4
    x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(0))
    if sequence_parallel:   # chapter 06's block runs on coursekit.comm: in this process's threads
        held = comm.simulate(_block_saved_bytes, tp, sequence_parallel, x).results
    else:                   # chapter 05's counted all-reduces are torch.distributed's: real ranks
        held = coursekit.launch(_block_saved_bytes, tp, sequence_parallel, x, timeout=240)
    for rank, measured in enumerate(held):
        assert measured == model.total + extra, f"tp = {tp}, sp {sequence_parallel}, rank {rank}: saved {measured}, " \
                                                f"model {model.total}"
    assert model.total == sbh * 4 * ((4 / tp if sequence_parallel else 4) + 12 / tp)
    if sequence_parallel:
        assert model.total + extra == megatron_sp_saved_bytes(b, s, h, a, 4 * h, tp)


def _sequence_saved_bytes(rank, world_size, attention, x):
    seq = x.shape[1]
    attend = {"ring": lambda q, k, v: ring_attention(q, k, v, True, "contiguous", seq),
              "ulysses": lambda q, k, v: ulysses_attention(q, k, v, True, seq)}[attention]
    model = tiny_transformer(seed=0)
    with saved_bytes(model.parameters()) as meter:
        sequence_forward(model, shard_sequence(x, 1, rank, world_size), positions(seq, rank, world_size), attend)
    return meter.bytes


@pytest.mark.parametrize("attention", ["ring", "ulysses"])
def test_context_parallel_activations_divide_by_sp(attention):
    """Chapter 06's ring attention and Ulysses on G = 1, 2, 4 ranks (the Layout's ``sp``): the whole course
    transformer's forward on b = 2 sequences of s = 32 tokens (no loss: sequence_forward returns the logits).

    The model: 2 layers of Table 2 (selective: the attention keeps q, k, v, o and the log-sum-exp, never the
    s×s scores, 4 bytes, no masks) + the output layer's inputs, divided by G as memory_per_gpu divides by
    ``layout.sp`` -- exactly, with the named extras: the norms' stats (4 floats a token a layer, 2 for ln_f),
    the log-sum-exp (a floats a token a layer), the token and position ids (int64). Ulysses keeps the attention
    output twice, head-split (its attention's) and sequence-split (proj's input after the all-to-all back): one
    more s·b·h a layer.
    """
    s, b, h, a, layers = 32, 2, 64, 4, 2
    tokens = s * b
    layer = activation_bytes_per_layer(s, b, h, a, recompute="selective", bytes_per_element=4, dropout=False).total
    model = layers * layer + logits_bytes(s, b, h, 16, bytes_per_element=4).inputs
    extra = layers * (4 + a) * tokens * 4 + 2 * tokens * 4 + 8 * (tokens + s)
    if attention == "ulysses":
        extra += layers * tokens * h * 4
    x = torch.randint(16, (b, s), generator=torch.Generator().manual_seed(0))
    for g in (1, 2, 4):
        held = comm.simulate(_sequence_saved_bytes, g, attention, x).results
        assert held == [(model + extra) // g] * g, f"{attention}, G = {g}: {held}, model {model} + {extra}, / {g}"
    course = ModelConfig.course(max_seq_len=s)
    one, four = (memory_per_gpu(course, Layout(sp=g), b, "fp32", dropout=False).activations for g in (1, 4))
    assert four == one / 4, f"memory_per_gpu at sp = 4: {four} activations, not 1/4 of {one}"
