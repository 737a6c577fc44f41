"""Checks of exercise 06 (``exercises/06_ring_attention.ipynb``): the online-softmax merge and the ring loop.

    from coursekit.grading import check_ring_attention
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

* ``merge_exact``: equal to softmax over all keys, when the parts' scores differ by 1.5 (either way) and when the
  scores are large (800 in float64, 100 in float32: e^lse overflows unless the maximum is subtracted first); with
  equal parts (where averaging is right) and parts 30 apart (where keeping only the larger part, or rescaling
  without normalising, is right to rounding: the other weighs e^−30) as preconditions
  (:mod:`.ring_attention_merges`);
* ``ring_equals_full_attention``: outputs, and the gradient of q through the learner's code, without a mask;
* ``causal_masking``: the same with a causal mask (blocks entirely in the future skipped; a ring that attends to
  later ranks' blocks, or ignores the mask, is told so);
* ``key_value_gradients``: the gradients of k and v, causal and not: most of a rank's comes from the other
  ranks' queries, so it exists only if each received block's gradient goes back to its owner (a block
  received with a bare ``comm.irecv`` has no autograd history: its owner keeps only its own queries' part);
* ``traffic_pattern``: every message to the right-hand neighbour, each rank sending 2(G−1)·b·h·L·d
  elements: each key and value block once per step, G−1 steps.

Right numbers are not enough for the loop's three checks (``ring_equals_full_attention``, ``causal_masking``,
``traffic_pattern``): a rank must do ring attention's blockwise work (:mod:`.ring_attention_work`): no score block
larger than L×L, and (in the forward-only run of ``traffic_pattern``, where autograd saves nothing) at most two
key/value blocks held at once. Passing every block around to run one full attention earns none of them
(``key_value_gradients`` still judges PassRight.backward, which such a loop may use rightly). A ring whose merge
is wrong is told to fix merge first.

With one rank there is nothing to pass, and with two every other rank is the neighbour (a gradient sent to the
right arrives where it belongs): in ``traffic_pattern`` and ``key_value_gradients`` those cases are
preconditions (they earn nothing; wrong, they cost as much as any case). A PassRight.backward that returns
None for ``o`` (not ``grad_o``) is named as such by the checks of q's gradient.
"""

from __future__ import annotations

import torch

from ..answers import AnswerHeldBack, held_back
from .registry import check
from .ring_attention_merges import (MERGE_CASES, MERGE_PRECONDITIONS, NO_RESCALE, OVERFLOWS, WRONG_MERGE, is_large,
                                    merge_case, merge_is_right, merge_mistake, tolerance)
from .ring_attention_runs import (B, D, H, L, attention_seeing_later_blocks, dq_with_o_cut, full_answer, run_ring,
                                  tensors)
from .ring_attention_work import not_blockwise
from .scoring import CheckFailed, NotDone, credit_said_once

EXERCISE = "06_ring_attention"
# The checks that judge the answer; the others judge its properties and earn nothing while it is wrong.
ANSWER = ("merge_exact", "ring_equals_full_attention", "causal_masking", "key_value_gradients")
SIZES = (2, 3, 4)


@check(EXERCISE, points=3)
def merge_exact(submission, ctx):
    """merge(o1, lse1, o2, lse2) gives softmax over both sets of keys, and their log-sum-exp (cases:
    :mod:`.ring_attention_merges`)."""
    outcomes, hinted = [], False
    for name, shifts, dtype in MERGE_CASES:
        parts, expected, expected_lse = merge_case(shifts, dtype)
        try:
            with held_back(EXERCISE):  # the library's merge is its answer: the learner's must be their own
                o, lse = submission.merge(*parts)
        except NotImplementedError:
            raise NotDone("merge: not implemented yet (NotImplementedError)") from None
        except AnswerHeldBack as error:  # said once: every case would say the same
            raise CheckFailed(f"merge raised AnswerHeldBack: {error}") from None
        except Exception as error:
            outcomes.append(f"merge raised {type(error).__name__}: {error}")
            continue
        tol, o, lse = tolerance(dtype), o.to(expected.dtype), lse.to(expected.dtype)
        o_right = torch.allclose(o, expected, atol=tol)  # NaN is never close
        if not o_right:
            outcomes.append(f"{name}: the merged output is off by {(o - expected).abs().max():.3g}")
        elif not torch.allclose(lse, expected_lse, atol=tol, rtol=tol):
            outcomes.append(f"{name}: the output is right but the returned lse is not log(e^lse1 + e^lse2)")
        else:
            outcomes.append(None)
            continue
        hint = None if hinted else _merge_hint(o, lse, o_right, parts, shifts, small_right=outcomes[0] is None)
        if hint:  # what the merge did, said once, at its first wrong case that tells
            outcomes[-1] += "\n" + hint
            hinted = True
    return credit_said_once(outcomes[MERGE_PRECONDITIONS:], outcomes[:MERGE_PRECONDITIONS])


def _merge_hint(o, lse, o_right: bool, parts, shifts, small_right: bool) -> str | None:
    """The mistake a wrong case shows: an overflow at large scores (inf or NaN), else a wrong weighting of o."""
    if is_large(shifts):  # only an overflow is named here: the small cases name a wrong weighting
        return None if torch.isfinite(o).all() and torch.isfinite(lse).all() else OVERFLOWS
    if shifts is None or o_right:
        return None
    return merge_mistake(o, *parts) or (NO_RESCALE if small_right else None)


def _ring_or_sentence(ctx, submission, world_size: int, causal: bool):
    """The ring's run at (G, causal), once per grading (the checks that judge it share it: ``ctx.memo``)."""
    return ctx.memo(("ring", world_size, causal), lambda: run_ring(submission, world_size, world_size * L, causal))


def _against_full(ctx, submission, world_size: int, causal: bool) -> str | None:
    seq = world_size * L
    run = _ring_or_sentence(ctx, submission, world_size, causal)
    if isinstance(run, str):
        return run
    results, _ = run
    lazy = not_blockwise([work for *_, work in results], world_size, causal, L, D)
    if lazy:  # the right numbers, but not from ring attention: the loop's checks earn nothing for them
        return lazy
    q = tensors(seq)[0]
    expected, (dq_full, _, _) = full_answer(seq, causal)
    for rank, (out, (dq, _, _), _, _) in enumerate(results):
        mine = slice(rank * L, (rank + 1) * L)
        if out.shape != expected[..., mine, :].shape:
            return f"G={world_size}: rank {rank} returned shape {tuple(out.shape)}, not {tuple(q[..., mine, :].shape)}"
        if torch.isnan(out).any():
            hint = (" — a block entirely in the future has no key to attend to (its log-sum-exp is -inf): skip it"
                    if causal else "")
            return f"G={world_size}: rank {rank}'s output has NaN{hint}"
        diff = (out - expected.detach()[..., mine, :]).abs().max().item()
        if not diff <= 1e-9:  # (NaN compares False with everything)
            return _output_mistake(submission, out, rank, world_size, causal, diff)
        if world_size > 1 and _wrong(dq, dq_full[..., mine, :]) and _drops_grad_o(results, world_size, causal):
            return (f"G={world_size}{', causal' if causal else ''}: rank {rank}'s gradient of q is what it would be "
                    f"if PassRight.backward returned None for o: {O_CUT}")
        if dq is None:
            return f"G={world_size}: no gradient reached q (is the output computed from q with torch operations?)"
        diff = (dq - dq_full[..., mine, :]).abs().max().item()
        if not diff <= 1e-9:
            return f"G={world_size}: rank {rank}'s gradient of q differs from full attention's by {diff:.3g}"
    return None


def _output_mistake(submission, out, rank: int, world_size: int, causal: bool, diff: float) -> str:
    """Rank ``rank``'s output differs from full attention's by ``diff``: what it is instead, when that is known."""
    where, mine = f"G={world_size}{', causal' if causal else ''}", slice(rank * L, (rank + 1) * L)
    if causal and not _wrong(out, attention_seeing_later_blocks(world_size * L)[..., mine, :]):
        return f"{where}: rank {rank}'s output attends to the blocks of later ranks: {LATER_BLOCKS}"
    if causal and not _wrong(out, full_answer(world_size * L, False)[0][..., mine, :]):
        return (f"{where}: rank {rank}'s output is attention without a mask: causal=True was ignored. "
                f"{LATER_BLOCKS}")
    merge_hint = "" if merge_is_right(submission.merge) else f": {WRONG_MERGE}"
    return f"{where}: rank {rank}'s output differs from full attention by {diff:.3g}{merge_hint}"


LATER_BLOCKS = ("every key of a block whose owner comes after you (owner > rank) is in the future of all your "
                "queries. With causal=True mask the future keys of the block you own (its diagonal), and skip a block "
                "whose owner comes after you (every key masked: nothing to compute)")
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
    dqs = [grads[0] for _, grads, _, _ in results]
    return (any(dq is not None for dq in dqs)
            and not any(_wrong(dq, dq_with_o_cut(world_size, causal, rank)) for rank, dq in enumerate(dqs)))


@check(EXERCISE, points=3)
def ring_equals_full_attention(submission, ctx):
    """Without a mask, at G = 1..4: each rank's output and the gradient of q equal full attention's."""
    return credit_said_once([_against_full(ctx, submission, g, False) for g in SIZES],
                          [_against_full(ctx, submission, 1, False)])


@check(EXERCISE, points=2)
def causal_masking(submission, ctx):
    """With a causal mask, at G = 1..4: each query sees only keys at or before its position."""
    return credit_said_once([_against_full(ctx, submission, g, True) for g in SIZES],
                          [_against_full(ctx, submission, 1, True)])


def _key_value_gradients(ctx, submission, world_size: int, causal: bool) -> str | None:
    seq, where = world_size * L, f"G={world_size}{', causal' if causal else ''}"
    run = _ring_or_sentence(ctx, submission, world_size, causal)
    if isinstance(run, str):
        return run
    results, _ = run
    expected, full = full_answer(seq, causal)
    for rank, (out, grads, back, _) in enumerate(results):
        mine = slice(rank * L, (rank + 1) * L)
        if not (out - expected[..., mine, :]).abs().max().item() <= 1e-9:
            return f"{where}: the output differs from full attention (see the checks above): its gradients cannot match"
        for name, got, want in (("k", grads[1], full[1]), ("v", grads[2], full[2])):
            if got is None:
                return f"{where}: no gradient reached {name} on rank {rank}"
            diff = (got - want[..., mine, :]).abs().max().item()
            if diff <= 1e-9:
                continue
            own = full_answer(seq, causal, mine)[1][1 if name == "k" else 2][..., mine, :]
            right = [t for t in back.payload if t.dst == (t.src + 1) % world_size]
            if (got - own).abs().max().item() <= 1e-9:
                return (f"{where}: rank {rank}'s gradient of {name} holds only its own queries' part (off by "
                        f"{diff:.3g}): the gradient the other ranks' queries produce for its block never came back. "
                        f"A block received with comm.irecv has no autograd history; pass it with PassRight, whose "
                        f"backward sends the gradient to the rank the block came from")
            if world_size > 1 and not back.payload:
                return (f"{where}: rank {rank}'s gradient of {name} differs from full attention's by {diff:.3g}: "
                        f"{SENT_NOTHING}")
            if right and world_size > 2:
                return (f"{where}: rank {rank}'s gradient of {name} differs from full attention's by {diff:.3g}; in "
                        f"backward rank {right[0].src} sent a gradient to rank {right[0].dst}, on to the right: a "
                        f"block's gradient goes back to the rank the block came from, r−1 (and arrives from r+1)")
            if _wrong(grads[0], full[0][..., mine, :]):
                return (f"{where}: rank {rank}'s gradient of {name} differs from full attention's by {diff:.3g}; "
                        f"the gradient of q is wrong too (see ring_equals_full_attention): fix that first")
            merge_hint = "" if merge_is_right(submission.merge) else f": {WRONG_MERGE}"
            return f"{where}: rank {rank}'s gradient of {name} differs from full attention's by {diff:.3g}{merge_hint}"
    return None


SENT_NOTHING = ("PassRight.backward sent nothing, so the gradient your queries produce for a received block stayed "
                "on your rank (added to your own block's) instead of going back to its owner. In backward, send "
                "grad_incoming to rank r−1, the rank the block came from, receive from rank r+1 the gradient of the "
                "block you sent it, and return that")


@check(EXERCISE, points=2)
def key_value_gradients(submission, ctx):
    """Causal and not, at G = 1..4: each rank's gradients of k and v equal full attention's (they come back
    around the ring from the other ranks' queries)."""
    # G = 1 and 2 are preconditions: at G = 2 both neighbours are the one other rank, so a gradient sent on to the
    # right (the way the block went) arrives where it belongs and only G >= 3 tells
    cases = [(g, causal) for causal in (False, True) for g in SIZES if g > 2]
    preconditions = [(g, causal) for causal in (False, True) for g in (1, 2)]
    return credit_said_once([_key_value_gradients(ctx, submission, g, c) for g, c in cases],
                          [_key_value_gradients(ctx, submission, g, c) for g, c in preconditions])


@check(EXERCISE, points=2, requires=ANSWER)
def traffic_pattern(submission, ctx):
    """Only neighbours: every message to rank r+1; each rank sends each key and value block once per step."""
    outcomes = []
    for world_size in (2,) + SIZES[1:]:  # G = 2: every other rank is the neighbour (a precondition)
        run = run_ring(submission, world_size, world_size * L, False, backward=False)  # forward's traffic
        if isinstance(run, str):
            outcomes.append(run)
            continue
        traffic = run[1]
        lazy = not_blockwise([work for *_, work in run[0]], world_size, False, L, D, held=True)
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
        else:  # the ring's traffic, and the ring's work (blocks held: nothing is saved for a backward here)?
            outcomes.append(lazy)
    return credit_said_once(outcomes[1:], outcomes[:1])
