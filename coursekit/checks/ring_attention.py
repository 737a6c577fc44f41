"""Checks of exercise 06 (``exercises/06_ring_attention.ipynb``): the online-softmax merge and the ring loop.

    from coursekit.checks.ring_attention import check_ring_attention
    check_ring_attention(merge, ring_attention_forward)

The learner writes two functions (and the backward of the notebook's ``PassRight``, which the loop uses):

* ``merge(o1, lse1, o2, lse2) -> (o, lse)``: two partial attention results over disjoint keys (each
  output normalised over its own keys, with its log-sum-exp) combined into the result over both;
* ``ring_attention_forward(q, k, v, causal=False) -> o``: on every rank, its contiguous chunk of the
  sequence (``(b, h, L, d)``, rank r holds tokens ``r·L … (r+1)·L − 1``); the key/value blocks passed to
  the right-hand neighbour (the notebook's ``PassRight``: ``coursekit.comm`` ``isend``/``irecv`` forward,
  the gradient sent back to the left in backward), merged with ``merge``.

Five checks, run in this process on the simulator (``comm.simulate``: the same calls as real ranks,
every message counted), G = 1..4 ranks, float64 against full attention (Liu et al. 2023):

* ``merge_exact``: equal to softmax over all keys, when the parts' scores differ by 1.5 (either way); with
  equal parts (where averaging is right) and parts 30 apart (where keeping only the larger part, or rescaling
  without normalising, is right to rounding: the other weighs e^−30) as preconditions;
* ``ring_equals_full_attention``: outputs, and the gradient of q through the learner's code, without a mask;
* ``causal_masking``: the same with a causal mask (blocks entirely in the future skipped);
* ``key_value_gradients``: the gradients of k and v, causal and not: most of a rank's comes from the other
  ranks' queries, so it exists only if each received block's gradient goes back to its owner (a block
  received with a bare ``comm.irecv`` has no autograd history: its owner keeps only its own queries' part);
* ``traffic_pattern``: every message to the right-hand neighbour, each rank sending 2(G−1)·b·h·L·d
  elements: each key and value block once per step, G−1 steps.

With one rank there is nothing to pass, and with two every other rank is the neighbour (a gradient sent to the
right arrives where it belongs): in ``traffic_pattern`` and ``key_value_gradients`` those cases are
preconditions (they earn nothing; wrong, they cost as much as any case). A PassRight.backward that returns
None for ``o`` (not ``grad_o``) is named as such by the checks of q's gradient.
"""

from __future__ import annotations

import torch

from .. import comm, grading
from ..parallel.sequence import block_attention, full_attention
from ..parallel.sequence import merge as right_merge

EXERCISE = "06_ring_attention"
SIZES = (2, 3, 4)
B, H, D, L = 2, 2, 4, 4  # batch, heads, head dim, tokens per rank


def check_ring_attention(merge=None, ring_attention_forward=None, **options) -> grading.Report:
    """Grade exercise 06: pass the two functions you wrote (``None`` for a part not done yet)."""
    def not_done(*args, **kwargs):
        raise NotImplementedError
    return grading.grade(EXERCISE, merge=merge or not_done,
                         ring_attention_forward=ring_attention_forward or not_done, **options)


def _tensors(seq: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, seq, D, generator=g, dtype=torch.float64) for _ in range(4)]  # q, k, v, dO


def _parts(scores: torch.Tensor, v: torch.Tensor, cut: int):
    def part(s, vv):
        lse = s.logsumexp(-1)
        return torch.exp(s - lse.unsqueeze(-1)) @ vv, lse
    return (*part(scores[..., :cut], v[..., :cut, :]), *part(scores[..., cut:], v[..., cut:, :]))


# The first three are preconditions: with equal parts averaging is right; 30 apart, the smaller part weighs e^−30,
# so keeping only the larger one, or rescaling without normalising, is right to rounding. Only 1.5 apart tells.
MERGE_CASES = (("parts with equal scores", None), ("the second part's scores 30 higher", 30.0),
               ("the first part's scores 30 higher", -30.0), ("the second part's scores 1.5 higher", 1.5),
               ("the first part's scores 1.5 higher", -1.5))
MERGE_PRECONDITIONS = 3
RESCALE = ("Weigh each part by its share of the total, e^(lse_i − lse) with lse = log(e^lse1 + e^lse2) "
           "(torch.logaddexp) — in max/sum terms l_i·e^(m_i − m)/l")
NO_RESCALE = ("your merge is right when both parts have the same log-sum-exp but not when they differ: it does not "
              "rescale by the running max. " + RESCALE)
PICKS_LARGER = ("your merge keeps only the part with the larger log-sum-exp: right when the other part's weight is "
                "negligible (e^−30), not when the two are close. Both parts count. " + RESCALE)
NOT_NORMALISED = ("your merge weighs the two parts by factors that do not sum to one (query 0: {:.3g} + {:.3g} = "
                  "{:.3g}): it rescales them but does not normalise (divide by the total weight). " + RESCALE)


def _merge_mistake(o, o1, lse1, o2, lse2) -> str | None:
    """What a wrong merge did, when its output is a per-query mix w1·o1 + w2·o2 of the parts (else None)."""
    if not torch.isfinite(o).all():
        return None
    parts = torch.stack([o1, o2], dim=-1)                                # (..., L, d, 2): d equations, 2 weights
    weights = torch.linalg.lstsq(parts, o.unsqueeze(-1)).solution        # (..., L, 2, 1)
    if not torch.allclose(parts @ weights, o.unsqueeze(-1), atol=1e-9):
        return None
    weights = weights.squeeze(-1)
    larger = (lse1 >= lse2).to(o.dtype)
    if torch.allclose(weights, torch.stack([larger, 1 - larger], dim=-1), atol=1e-6):
        return PICKS_LARGER
    total = weights.sum(-1)
    if not torch.allclose(total, torch.ones_like(total), atol=1e-6):
        w1, w2 = weights.flatten(0, -2)[0].tolist()
        return NOT_NORMALISED.format(w1, w2, w1 + w2)
    return NO_RESCALE


@grading.check(EXERCISE, points=3)
def merge_exact(submission, ctx):
    """merge(o1, lse1, o2, lse2) gives softmax over both sets of keys, and their log-sum-exp."""
    outcomes, hinted = [], False
    for name, shift in MERGE_CASES:
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(3, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
        scores = q @ k.transpose(-1, -2)
        if shift is None:
            scores = torch.cat([scores[..., :3], scores[..., :3]], dim=-1)
            v = torch.cat([v[:, :3], v[:, :3]], dim=1)
        else:
            scores[..., 3:] += shift
        parts = _parts(scores, v, 3)
        try:
            o, lse = submission.merge(*parts)
        except NotImplementedError:
            raise grading.NotDone("merge: not implemented yet (NotImplementedError)") from None
        except Exception as error:
            outcomes.append(f"merge raised {type(error).__name__}: {error}")
            continue
        expected = scores.softmax(-1) @ v
        if not torch.allclose(o, expected, atol=1e-9):  # NaN is never close
            outcomes.append(f"{name}: the merged output is off by {(o - expected).abs().max():.3g}")
            if shift is not None and not hinted:  # what the merge did, said once, at its first wrong shifted case
                hint = _merge_mistake(o, *parts) or (NO_RESCALE if outcomes[0] is None else None)
                if hint:
                    outcomes[-1] += "\n" + hint
                    hinted = True
        elif not torch.allclose(lse, scores.logsumexp(-1), atol=1e-9):
            outcomes.append(f"{name}: the output is right but the returned lse is not log(e^lse1 + e^lse2)")
        else:
            outcomes.append(None)
    return grading.partial_credit(outcomes[MERGE_PRECONDITIONS:], outcomes[:MERGE_PRECONDITIONS])


def _run_ring(submission, world_size: int, seq: int, causal: bool, backward: bool = True):
    """The learner's ring on ``world_size`` simulated ranks, or a sentence.

    Returns (per rank ``(output, [dq, dk, dv], backward traffic)``, all traffic). ``backward=False``: forward
    only, nothing requires grad (no gradient is sent).
    """
    q, k, v, grad = _tensors(seq)

    def rank_fn(rank, size):
        mine = [t[..., rank * L:(rank + 1) * L, :].clone().requires_grad_(backward) for t in (q, k, v)]
        out = submission.ring_attention_forward(*mine, causal=causal)
        with comm.record() as back:
            if out.requires_grad:
                try:
                    (out * grad[..., rank * L:(rank + 1) * L, :]).sum().backward()
                except NotImplementedError as error:
                    raise _BackwardNotDone(str(error)) from None
        return out.detach(), [t.grad for t in mine], back
    try:
        results, traffic = comm.simulate(rank_fn, world_size, timeout=20)
    except comm.Deadlock as error:
        return f"G={world_size}: {error}"
    except comm.SimulatorError as error:
        last = error.remote_traceback.strip().splitlines()[-1]
        if "_BackwardNotDone" in last:
            return (f"G={world_size}: the output was computed, but backward raised NotImplementedError: "
                    f"write PassRight.backward")
        if "NotImplementedError" in last:
            raise grading.NotDone("ring_attention_forward: not implemented yet (NotImplementedError)") from None
        return f"G={world_size}: rank {error.rank} raised {last}"
    except TimeoutError as error:
        return f"G={world_size}: {error}"
    return results, traffic


class _BackwardNotDone(Exception):
    """The forward ran; the backward (the learner's PassRight.backward) is not written yet."""


def _full(seq: int, causal: bool, rows: slice | None = None):
    """Full attention's output and ``[dq, dk, dv]``; ``rows``: the loss of those queries only."""
    q, k, v, grad = _tensors(seq)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = full_attention(*leaves, causal)
    if rows is not None:
        keep = torch.zeros(seq, 1, dtype=grad.dtype)
        keep[rows] = 1
        grad = grad * keep
    (out * grad).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _ring_or_sentence(submission, world_size: int, causal: bool, cache: dict):
    """The ring's run at (G, causal), once per grading (the two checks that judge it share it)."""
    key = (world_size, causal)
    if key not in cache:
        cache[key] = _run_ring(submission, world_size, world_size * L, causal)
    return cache[key]


def _against_full(submission, world_size: int, causal: bool, cache: dict | None = None) -> str | None:
    seq = world_size * L
    run = _ring_or_sentence(submission, world_size, causal, {} if cache is None else cache)
    if isinstance(run, str):
        return run
    results, _ = run
    q = _tensors(seq)[0]
    expected, (dq_full, _, _) = _full(seq, causal)
    for rank, (out, (dq, _, _), _) in enumerate(results):
        mine = slice(rank * L, (rank + 1) * L)
        if out.shape != expected[..., mine, :].shape:
            return f"G={world_size}: rank {rank} returned shape {tuple(out.shape)}, not {tuple(q[..., mine, :].shape)}"
        if torch.isnan(out).any():
            hint = (" — a block entirely in the future has no key to attend to (its log-sum-exp is -inf): skip it"
                    if causal else "")
            return f"G={world_size}: rank {rank}'s output has NaN{hint}"
        diff = (out - expected.detach()[..., mine, :]).abs().max().item()
        if not diff <= 1e-9:  # (NaN compares False with everything)
            return (f"G={world_size}{', causal' if causal else ''}: rank {rank}'s output differs from full attention "
                    f"by {diff:.3g}")
        if world_size > 1 and _wrong(dq, dq_full[..., mine, :]) and _drops_grad_o(results, world_size, causal):
            return (f"G={world_size}{', causal' if causal else ''}: rank {rank}'s gradient of q is what it would be "
                    f"if PassRight.backward returned None for o: {O_CUT}")
        if dq is None:
            return f"G={world_size}: no gradient reached q (is the output computed from q with torch operations?)"
        diff = (dq - dq_full[..., mine, :]).abs().max().item()
        if not diff <= 1e-9:
            return f"G={world_size}: rank {rank}'s gradient of q differs from full attention's by {diff:.3g}"
    return None


O_CUT = ("the output's gradient then stops at each pass, and the blocks merged before it reach q only through "
         "their log-sum-exp (or not at all). o rides along unchanged, so its gradient does too: return grad_o "
         "unchanged as backward's second value")


def _wrong(got, want) -> bool:
    """``got`` is not ``want`` (None, a missing gradient, is right only where none is expected)."""
    if got is None or want is None:
        return (got is None) != (want is None)
    return not (got - want).abs().max().item() <= 1e-9


def _drops_grad_o(results, world_size: int, causal: bool) -> bool:
    """Whether every rank's gradient of q is what a PassRight.backward returning None for o gives (on some rank not
    None: a ring whose output never reaches q, on any rank, is told that instead)."""
    dqs = [grads[0] for _, grads, _ in results]
    return (any(dq is not None for dq in dqs)
            and not any(_wrong(dq, _dq_with_o_cut(world_size, causal, rank)) for rank, dq in enumerate(dqs)))


def _dq_with_o_cut(world_size: int, causal: bool, rank: int):
    """Rank ``rank``'s gradient of q from the solution's loop with o's gradient cut at each pass (what a
    PassRight.backward returning None for o gives); None where no gradient reaches q then."""
    q, k, v, grad = _tensors(world_size * L)
    mine = slice(rank * L, (rank + 1) * L)
    query = q[..., mine, :].clone().requires_grad_()
    q_pos = torch.arange(rank * L, (rank + 1) * L)
    o = lse = None
    for step in range(world_size):
        owner = (rank - step) % world_size
        theirs = slice(owner * L, (owner + 1) * L)
        mask = torch.arange(owner * L, (owner + 1) * L).unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):
            o_block, lse_block = block_attention(query, k[..., theirs, :], v[..., theirs, :], mask)
            o, lse = (o_block, lse_block) if o is None else right_merge(o, lse, o_block, lse_block)
        if step < world_size - 1:
            o = o.detach()  # the pass, whose backward gives o no gradient (lse stays on the rank: it keeps its own)
    if not o.requires_grad:
        return None
    (o * grad[..., mine, :]).sum().backward()
    return query.grad


def _cache(submission) -> dict:
    """Runs of the learner's ring remembered on the submission namespace ``grade()`` builds for one grading."""
    if not hasattr(submission, "_ring_runs"):
        submission._ring_runs = {}
    return submission._ring_runs


@grading.check(EXERCISE, points=3)
def ring_equals_full_attention(submission, ctx):
    """Without a mask, at G = 1..4: each rank's output and the gradient of q equal full attention's."""
    cache = _cache(submission)
    return grading.partial_credit([_against_full(submission, g, False, cache) for g in SIZES],
                                  [_against_full(submission, 1, False, cache)])


@grading.check(EXERCISE, points=2)
def causal_masking(submission, ctx):
    """With a causal mask, at G = 1..4: each query sees only keys at or before its position."""
    cache = _cache(submission)
    return grading.partial_credit([_against_full(submission, g, True, cache) for g in SIZES],
                                  [_against_full(submission, 1, True, cache)])


def _key_value_gradients(submission, world_size: int, causal: bool, cache: dict) -> str | None:
    seq, where = world_size * L, f"G={world_size}{', causal' if causal else ''}"
    run = _ring_or_sentence(submission, world_size, causal, cache)
    if isinstance(run, str):
        return run
    results, _ = run
    expected, full = _full(seq, causal)
    for rank, (out, grads, back) in enumerate(results):
        mine = slice(rank * L, (rank + 1) * L)
        if not (out - expected[..., mine, :]).abs().max().item() <= 1e-9:
            return f"{where}: the output differs from full attention (see the checks above): its gradients cannot match"
        for name, got, want in (("k", grads[1], full[1]), ("v", grads[2], full[2])):
            if got is None:
                return f"{where}: no gradient reached {name} on rank {rank}"
            diff = (got - want[..., mine, :]).abs().max().item()
            if diff <= 1e-9:
                continue
            own = _full(seq, causal, mine)[1][1 if name == "k" else 2][..., mine, :]
            right = [t for t in back.payload if t.dst == (t.src + 1) % world_size]
            if (got - own).abs().max().item() <= 1e-9:
                return (f"{where}: rank {rank}'s gradient of {name} holds only its own queries' part (off by "
                        f"{diff:.3g}): the gradient the other ranks' queries produce for its block never came back. "
                        f"A block received with comm.irecv has no autograd history; pass it with PassRight, whose "
                        f"backward sends the gradient to the rank the block came from")
            if right and world_size > 2:
                return (f"{where}: rank {rank}'s gradient of {name} differs from full attention's by {diff:.3g}; in "
                        f"backward rank {right[0].src} sent a gradient to rank {right[0].dst}, on to the right: a "
                        f"block's gradient goes back to the rank the block came from, r−1 (and arrives from r+1)")
            if _wrong(grads[0], full[0][..., mine, :]):
                return (f"{where}: rank {rank}'s gradient of {name} differs from full attention's by {diff:.3g}; "
                        f"the gradient of q is wrong too (see ring_equals_full_attention): fix that first")
            return f"{where}: rank {rank}'s gradient of {name} differs from full attention's by {diff:.3g}"
    return None


@grading.check(EXERCISE, points=2)
def key_value_gradients(submission, ctx):
    """Causal and not, at G = 1..4: each rank's gradients of k and v equal full attention's (they come back
    around the ring from the other ranks' queries)."""
    cache = _cache(submission)
    # G = 1 and 2 are preconditions: at G = 2 both neighbours are the one other rank, so a gradient sent on to the
    # right (the way the block went) arrives where it belongs and only G >= 3 tells
    cases = [(g, causal) for causal in (False, True) for g in SIZES if g > 2]
    preconditions = [(g, causal) for causal in (False, True) for g in (1, 2)]
    return grading.partial_credit([_key_value_gradients(submission, g, c, cache) for g, c in cases],
                                  [_key_value_gradients(submission, g, c, cache) for g, c in preconditions])


@grading.check(EXERCISE, points=2)
def traffic_pattern(submission, ctx):
    """Only neighbours: every message to rank r+1; each rank sends each key and value block once per step."""
    outcomes = []
    for world_size in (2,) + SIZES[1:]:  # G = 2: every other rank is the neighbour (a precondition)
        run = _run_ring(submission, world_size, world_size * L, False, backward=False)  # forward's traffic
        if isinstance(run, str):
            outcomes.append(run)
            continue
        traffic = run[1]
        far = [t for t in traffic.payload if t.dst != (t.src + 1) % world_size]
        want = 2 * (world_size - 1) * B * H * L * D
        if far:
            t = far[0]
            outcomes.append(f"G={world_size}: rank {t.src} sent to rank {t.dst}: in ring attention each rank sends "
                            f"only to its right-hand neighbour, rank {(t.src + 1) % world_size}")
        elif any(n != want for n in traffic.sent.values()):
            sent = traffic.sent
            outcomes.append(f"G={world_size}: the ranks sent {[sent[r] for r in range(world_size)]} elements; the "
                            f"ring sends 2(G−1)·b·h·L·d = {want} each: its key and value block once per step, "
                            f"G−1 steps (the last block needs no passing on)")
        else:
            outcomes.append(None)
    return grading.partial_credit(outcomes[1:], outcomes[:1])
