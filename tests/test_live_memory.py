"""Live memory, exact (issue 26 §3, §5): coursekit.measure.live_memory's tracker, one block's peak per rank, and the
longest sequence under a budget.

Every expected number is counted here from sizes: the tracker against hand-counted layers, the block's plateau
against the course's count per token (tests/test_parallel_sequence_memory.py derives the same terms), its peak
against the transient named in each docstring, and the capacity search against its own measurements.
"""

import doctest

import pytest
import torch

from coursekit.measure import live_memory
from coursekit.measure.live_memory import LiveMemory, forward_backward_memory
from coursekit.experiments import CAPACITY_METHODS, attention_peak, block_memory, longest_sequence
from coursekit.experiments import sequence_capacity as capacity

F32 = 4


def test_a_linear_layer_holds_its_output_then_its_inputs_gradient():
    """Linear(5 → 3) on x of 2 × 5 (x and the weights made before: not counted). Forward: y, 2·3 floats = 24
    bytes, the plateau (addmm saves x and the weight, which were there). Backward with dy given: x.grad =
    dy @ W, 2·5 floats = 40 bytes, born beside y: peak 64; the weight's and bias's gradients (15 + 3 floats)
    are model state and left out. Planted bugs, seen failing: views counted as new storage (the weight's
    transpose: "plateau 84, not 24"); the parameters' gradients not left out ("peak 136, not 64")."""
    layer = torch.nn.Linear(5, 3)
    x, dy = torch.randn(2, 5, requires_grad=True), torch.randn(2, 3)
    run = forward_backward_memory(layer, x, grad_output=dy)
    assert run.plateau == 2 * 3 * F32, f"plateau {run.plateau}, not 24"
    assert run.peak == (2 * 3 + 2 * 5) * F32, f"peak {run.peak}, not 64"
    assert run.transient == 2 * 5 * F32 and run.at_peak == {"addmm": 24, "mm": 40}, run


def test_a_freed_transient_leaves_the_live_bytes_and_stays_in_the_peak():
    """gelu(Linear(5 → 3)(x)), b = 2: forward h and z = gelu(h), 24 bytes each (gelu saves h): plateau 48.
    Backward: gelu_backward's dh (24) beside h and z: 72; gelu's node has run, so autograd releases the h it
    saved; addmm's dx (40) beside z and dh: 88, the peak; dh is freed: 64 live at the end (z and x.grad).
    Planted bug, seen failing: frees not subtracted ("peak 112, not 88")."""
    layer = torch.nn.Linear(5, 3)
    x, dz = torch.randn(2, 5, requires_grad=True), torch.randn(2, 3)
    with LiveMemory(params=layer.parameters()) as mem:
        z = torch.nn.functional.gelu(layer(x))
        mem.mark("forward")
        z.backward(dz)
    assert mem.marks["forward"] == 2 * 2 * 3 * F32
    assert mem.peak == (2 * 2 * 3 + 2 * 5) * F32, f"peak {mem.peak}, not 88"
    assert mem.live == (2 * 3 + 2 * 5) * F32, f"live at the end {mem.live}, not 64"
    assert mem.born_after("forward") == (2 * 3 + 2 * 5) * F32       # dh and dx, born in backward


B, S, H, A, FF = 2, 32, 64, 4, 256     # chapter 06's block: block_memory's defaults


def _plateau_elements_per_token(t: int, sequence_parallel: bool) -> float:
    """What one rank keeps per token of the whole sequence (tests/test_parallel_sequence_memory.py's terms)."""
    around = (2 * H + 2 * 2) + 2 * H            # the norms' inputs, mean and 1/std; qkv's and fc's inputs
    split = (3 * H + H + A) + 2 * FF            # q, k, v, attention's output, its log-sum-exp; GELU in and out
    return (around / t if sequence_parallel else around) + split / t


@pytest.fixture(scope="module")
def blocks():
    return block_memory(B, S, sizes=(2, 4))


def test_the_plateau_is_the_courses_count_and_every_rank_alike(blocks):
    """End of forward, per rank: 1032, 646, 453 elements a token (dense, plain TP at t = 2, 4), 516 and 258 with
    SP -- the block charged with its output, not its input (the same size: the next block keeps it).
    Planted bug, seen failing: the SP block's fc input kept whole (all-gather, then F.linear):
    "('sequence_tensor', 2): plateau [140288, 140288], expected 132096"."""
    expected = {("dense", 1): _plateau_elements_per_token(1, False)}
    expected |= {(name, t): _plateau_elements_per_token(t, name == "sequence_tensor")
                 for t in (2, 4) for name in ("tensor", "sequence_tensor")}
    assert [expected[k] for k in sorted(expected)] == [1032, 516, 258, 646, 453]
    for key, per_token in expected.items():
        plateau = [r.plateau for r in blocks[key]]
        want = int(per_token * B * S * F32)
        assert plateau == [want] * len(plateau), f"{key}: plateau {plateau}, expected {want}"


def test_dense_and_tensor_parallel_peaks_are_the_plateau_and_one_transient(blocks):
    """Dense and plain TP: the peak is the plateau plus the larger of two transients, b·S·max(h, d_ff/t) floats.
    In backward the first op, the MLP's second matmul, makes the gradient of its input, b·S·d_ff/t, while all the
    forward kept is alive; in forward the MLP's last output (b·S·h) lives beside its all-reduced copy (TP) or the
    residual sum (dense) before the block's output replaces it. d_ff/t = 256, 128, 64 against h = 64: the
    backward's gradient dominates the dense block and t = 2 (born in backward: the transient), ties at t = 4.
    Planted bug, seen failing: frees not subtracted ("('dense', 1): peak 444416, expected 313344")."""
    for key in (("dense", 1), ("tensor", 2), ("tensor", 4)):
        t = key[1]
        for run in blocks[key]:
            want = run.plateau + B * S * max(H, FF // t) * F32
            assert run.peak == want, f"{key}: peak {run.peak}, expected {want}"
            if FF // t > H:
                assert (run.transient, run.peak_op) == (B * S * FF // t * F32, "mm"), (key, run)


def test_sequence_parallel_peaks_add_the_gathered_gradients(blocks):
    """TP + SP. t = 2: in the MLP's backward the output's gradient is all-gathered whole (b·S·h) and the second
    matmul makes the hidden layer's gradient (b·S·d_ff/t), both beside all the forward kept: peak = plateau +
    b·S·(h + d_ff/t). t = 4: the plateau is smaller and a later moment is the worst, fc's backward: its input
    all-gathered again (b·S·h), its input's gradient before the reduce-scatter (b·S·h), the t − 1 pieces sent
    (non-contiguous slices of (b, S, h): copied) and the t − 1 received (b·S/t·h each), beside the GELU's
    gradient (b·S·d_ff/t): transient = b·S·(2h + 2(t−1)h/t + d_ff/t), on what the forward kept and backward has
    not yet freed (less than the plateau). Planted bug, seen failing: a send's buffer freed before its transfer
    is waited on (comm.Work not holding its tensor): "t = 4: transient 32768, expected 73728"."""
    for run in blocks["sequence_tensor", 2]:
        want = B * S * (H + FF // 2) * F32
        assert (run.peak - run.plateau, run.transient) == (want, want), (run.peak - run.plateau, run.transient, want)
    t = 4
    for run in blocks["sequence_tensor", t]:
        want = B * S * (2 * H + 2 * (t - 1) * H // t + FF // t) * F32
        assert run.transient == want, f"t = {t}: transient {run.transient}, expected {want}"
        assert run.peak - run.transient < run.plateau < run.peak
    tp, sp = blocks["tensor", 4][0].peak, blocks["sequence_tensor", 4][0].peak
    assert sp < tp, f"at t = 4 sequence parallelism's peak {sp} should be below plain TP's {tp}"


@pytest.mark.parametrize("method", CAPACITY_METHODS)
def test_the_longest_sequence_fits_and_one_step_more_does_not(method):
    """1 MiB per rank, steps of 128 tokens, 2 ranks: the S found is measured again here within the budget and
    S + 128 above it; every length the search measured on the way agrees with its verdict.
    Planted bugs, seen failing: the bisection returning its upper end ("ulysses: S = 768 needs 1,081,344
    bytes"); the doubling stopping after one step ("ulysses: S + 128 = 256 fits (360,448 bytes)")."""
    budget, step = 2**20, 128
    found, measured = longest_sequence(method, budget, 2, step)
    assert found > 0 or method == "full", method
    if found:
        assert attention_peak(method, found) <= budget, f"{method}: S = {found} needs {attention_peak(method, found):,} bytes"
    more = attention_peak(method, found + step)
    assert more > budget, f"{method}: S + {step} = {found + step} fits ({more:,} bytes)"
    assert all((peak <= budget) == (n <= found) for n, peak in measured.items()), (method, measured)


def test_the_fused_ring_holds_at_most_1_5_times_ulysses_and_the_textbook_ring_more():
    """S = 1024 on 2 ranks, 4 heads of 16: the fused zig-zag ring keeps no score block (issue 26 §5's target,
    ≤ 1.5× Ulysses' peak per rank); the textbook ring holds (S/2G)² scores per block pair and exceeds it.
    Planted bug, seen failing: the fused method run with the textbook kernel ("3.98x, textbook 3.98x")."""
    ulysses = attention_peak("ulysses", 1024)
    fused, textbook = attention_peak("ring, fused", 1024), attention_peak("ring, textbook", 1024)
    assert fused <= 1.5 * ulysses < textbook, f"{fused / ulysses:.2f}x, textbook {textbook / ulysses:.2f}x"
    assert attention_peak("ring, fused", 1024) == fused, "the same bytes every run"


def test_as_rank_is_one_rank_of_many_and_refuses_inside_another_group():
    """Inside as_rank(r, G) torch.distributed reports rank r of G, and a second as_rank refuses with a clear
    message (a process group is already there) instead of torch's. Planted bug, seen failing: the check removed
    ("ValueError: trying to initialize the default process group twice!")."""
    import torch.distributed as dist

    with live_memory.as_rank(2, 4):
        assert (dist.get_rank(), dist.get_world_size()) == (2, 4)
        with pytest.raises(RuntimeError, match="as_rank needs a process without a process group"):
            with live_memory.as_rank(0, 2):
                pass
    assert not dist.is_initialized()


def test_doctests():
    """The examples in coursekit/measure/live_memory.py run as written (a Linear's 24 and 56 bytes; as_rank)."""
    for module in (live_memory, capacity):
        failures, tried = doctest.testmod(module)
        assert failures == 0 and (tried or module is capacity), f"{module.__name__}: {failures} of {tried}"
