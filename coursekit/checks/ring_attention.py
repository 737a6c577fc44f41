"""Checks of exercise 06 (``exercises/06_ring_attention.ipynb``): the online-softmax merge and the ring loop.

    from coursekit.checks.ring_attention import check_ring_attention
    check_ring_attention(merge, ring_attention_forward)

The learner writes two functions:

* ``merge(o1, lse1, o2, lse2) -> (o, lse)``: two partial attention results over disjoint keys (each
  output normalised over its own keys, with its log-sum-exp) combined into the result over both;
* ``ring_attention_forward(q, k, v, causal=False) -> o``: on every rank, its contiguous chunk of the
  sequence (``(b, h, L, d)``, rank r holds tokens ``r·L … (r+1)·L − 1``); the key/value blocks passed to
  the right-hand neighbour with ``coursekit.comm`` ``isend``/``irecv``, merged with ``merge``.

Four checks, run in this process on the simulator (``comm.simulate``: the same calls as real ranks,
every message counted), G = 1..4 ranks, float64 against full attention (Liu et al. 2023):

* ``merge_exact``: equal to softmax over all keys, when the parts' maxima differ by a lot too;
* ``ring_equals_full_attention``: outputs, and the gradient of q through the learner's code, without a mask;
* ``causal_masking``: the same with a causal mask (blocks entirely in the future skipped);
* ``traffic_pattern``: every message to the right-hand neighbour, each rank sending 2(G−1)·b·h·L·d
  elements: each key and value block once per step, G−1 steps.

With one rank there is nothing to pass, and with two every other rank is the neighbour: those cases are
preconditions (they earn nothing; wrong, they cost as much as any case).
"""

from __future__ import annotations

import torch

from .. import comm, grading
from ..parallel.ring_attention import full_attention

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


@grading.check(EXERCISE, points=3)
def merge_exact(submission, ctx):
    """merge(o1, lse1, o2, lse2) gives softmax over both sets of keys, and their log-sum-exp."""
    outcomes, wrong = [], []
    for name, shift in (("parts with equal scores", None), ("the second part's scores 30 higher", 30.0),
                        ("the first part's scores 30 higher", -30.0)):
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
            wrong.append(name)
            outcomes.append(f"{name}: the merged output is off by {(o - expected).abs().max():.3g}")
        elif not torch.allclose(lse, scores.logsumexp(-1), atol=1e-9):
            outcomes.append(f"{name}: the output is right but the returned lse is not log(e^lse1 + e^lse2)")
        else:
            outcomes.append(None)
    if wrong and "parts with equal scores" not in wrong:
        first = next(i for i, o in enumerate(outcomes) if o and o.startswith(wrong[0]))
        outcomes[first] += ("\nyour merge is right when both parts have the same log-sum-exp but not when they "
                            "differ: it does not rescale by the running max. Weigh each part by its share of the "
                            "total, e^(lse_i − lse) with lse = log(e^lse1 + e^lse2) — in max/sum terms "
                            "l_i·e^(m_i − m)/l")
    return grading.partial_credit(outcomes)


def _run_ring(submission, world_size: int, seq: int, causal: bool):
    """The learner's ring on ``world_size`` simulated ranks: (outputs, dq per rank, traffic) or a sentence."""
    q, k, v, grad = _tensors(seq)

    def rank_fn(rank, size):
        mine = [t[..., rank * L:(rank + 1) * L, :].clone() for t in (q, k, v)]
        mine[0].requires_grad_()
        out = submission.ring_attention_forward(*mine, causal=causal)
        if out.requires_grad:
            (out * grad[..., rank * L:(rank + 1) * L, :]).sum().backward()
        return out.detach(), mine[0].grad
    try:
        results, traffic = comm.simulate(rank_fn, world_size, timeout=20)
    except comm.Deadlock as error:
        return f"G={world_size}: {error}"
    except comm.SimulatorError as error:
        last = error.remote_traceback.strip().splitlines()[-1]
        if "NotImplementedError" in last:
            raise grading.NotDone("ring_attention_forward: not implemented yet (NotImplementedError)") from None
        return f"G={world_size}: rank {error.rank} raised {last}"
    except TimeoutError as error:
        return f"G={world_size}: {error}"
    return results, traffic


def _against_full(submission, world_size: int, causal: bool) -> str | None:
    seq = world_size * L
    run = _run_ring(submission, world_size, seq, causal)
    if isinstance(run, str):
        return run
    results, _ = run
    q, k, v, grad = _tensors(seq)
    leaf = q.clone().requires_grad_()
    expected = full_attention(leaf, k, v, causal)
    (expected * grad).sum().backward()
    for rank, (out, dq) in enumerate(results):
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
        if dq is None:
            return f"G={world_size}: no gradient reached q (is the output computed from q with torch operations?)"
        diff = (dq - leaf.grad[..., mine, :]).abs().max().item()
        if not diff <= 1e-9:
            return f"G={world_size}: rank {rank}'s gradient of q differs from full attention's by {diff:.3g}"
    return None


@grading.check(EXERCISE, points=3)
def ring_equals_full_attention(submission, ctx):
    """Without a mask, at G = 1..4: each rank's output and the gradient of q equal full attention's."""
    return grading.partial_credit([_against_full(submission, g, False) for g in SIZES],
                                  [_against_full(submission, 1, False)])


@grading.check(EXERCISE, points=2)
def causal_masking(submission, ctx):
    """With a causal mask, at G = 1..4: each query sees only keys at or before its position."""
    return grading.partial_credit([_against_full(submission, g, True) for g in SIZES],
                                  [_against_full(submission, 1, True)])


@grading.check(EXERCISE, points=2)
def traffic_pattern(submission, ctx):
    """Only neighbours: every message to rank r+1; each rank sends each key and value block once per step."""
    outcomes = []
    for world_size in (2,) + SIZES[1:]:  # G = 2: every other rank is the neighbour (a precondition)
        run = _run_ring(submission, world_size, world_size * L, False)
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
