# %% [markdown]
# BEGIN SOLUTION
# # Solution 06 · Sequence parallelism: write ring attention
# EXERCISE: # # Exercise 06 · Sequence parallelism: write ring attention
# END SOLUTION
#
# In `notebooks/06_sequence_parallelism.ipynb` the sequence was split over ranks (**P9**): chunk-local
# attention lost accuracy, ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers")
# reproduced full attention to rounding. Here you write its three parts:
#
# 1. **`merge(o1, lse1, o2, lse2) -> (o, lse)`**, the online softmax. `o1` is attention over a first set of
#    keys, normalised over those keys alone, and `lse1` its log-sum-exp (`lse = m + log l`: running max m,
#    sum of exponentials l); the same for a second, disjoint set. Return attention over both, and its
#    log-sum-exp. `o` has shape `(..., L, d)`, `lse` `(..., L)`.
# 2. **`PassRight.backward`**, the pass the gradients need. `comm.irecv` fills a fresh tensor: autograd
#    does not know it came from rank r−1, so the gradient your queries produce for that block would stay
#    on your rank, and its owner's gradients of k and v would miss it. `PassRight` is a
#    `torch.autograd.Function` whose forward sends a block to rank r+1 and returns rank r−1's; you write its
#    backward: the gradient goes back the way the block came.
# 3. **`ring_attention_forward(q, k, v, causal=False) -> o`**, the ring loop. Every rank calls it with its
#    contiguous chunk `(b, h, L, d)` of the sequence: rank r holds tokens `r·L … (r+1)·L − 1`. At each of G
#    steps, compute your queries against the key/value block you hold (`block_attention` below returns its
#    `(o, lse)`), merge, and pass the block on with `PassRight` (G−1 passes). With `causal=True` a query sees
#    only keys at or before its position: mask the future, and skip a block that is entirely in the future
#    (it has no key to attend to).
#
# **Grading** (`check_ring_attention`, on the single-process simulator, 1 to 4 ranks, float64): `merge` equals
# softmax over all keys, when the two parts' maxima differ by a little and by a lot, and when the scores are large
# (800 in float64, 100 in float32, where `e^lse` alone overflows); the ring's outputs and the gradient
# of q equal full attention's, without and with the causal mask; the gradients of k and v too (each rank's
# keys are attended to by every later rank's queries: their gradient must come back around the ring); and the
# work and traffic: one L×L score block per step (never all keys at once), at most two key/value blocks held at
# once, every message to the right-hand neighbour, each rank sending its key and value block once per step.
# From a terminal: `make grade NB=exercises/06_ring_attention.ipynb`.
#
# **What this version gives up.** Written this way, with autograd doing the backward, it saves for backward
# every key/value block a rank receives and every block's L×L probabilities (what `q kᵀ` and the softmax in
# `block_attention` need for their gradients): by the last step a rank holds every block it attended to and
# each one's score block, so its memory grows with the whole sequence again — the memory property the chapter
# just taught is lost, although the forward never holds more than two blocks at a time. The library's `ring_attention` is a
# `torch.autograd.Function` with its own blockwise backward: it saves only q, k, v, the output and its
# log-sum-exp, and in backward passes the blocks around the ring again, recomputing each block's
# probabilities from the saved log-sum-exp (and with `kernel="fused"` never holds a whole score block).

# %% tags=["parameters"]
# Parameters: none needed; the checks run in this process in a few seconds.
RANKS = 4

# %%
import torch

from coursekit import comm
from coursekit.grading import check_ring_attention
from coursekit.parallel.sequence import block_attention, full_attention

# %% [markdown]
# ## Part 1: the merge
#
# Hint: the total log-sum-exp is `lse = log(e^lse1 + e^lse2)` (`torch.logaddexp`); part i's share of the total
# weight is `e^(lse_i − lse)`. Averaging the parts, or weighing them by `l_i` computed against their *own*
# maxima, is the classic bug: right only when both parts have the same maximum.


# %%
def merge(o1, lse1, o2, lse2):
# BEGIN SOLUTION
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1 - lse).unsqueeze(-1) * o1 + torch.exp(lse2 - lse).unsqueeze(-1) * o2, lse
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("weigh each part by e^(lse_i - lse), with lse = log(e^lse1 + e^lse2)")
# END SOLUTION


# %% [markdown]
# Try it: two halves of 6 keys, the second half's scores 30 higher. The merge should equal softmax over all six.

# %%
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
scores = q @ k.transpose(-1, -2)
scores[..., 3:] += 30.0
halves = []
for s, vv in ((scores[..., :3], v[:, :3]), (scores[..., 3:], v[:, 3:])):
    lse = s.logsumexp(-1)
    halves += [torch.exp(s - lse.unsqueeze(-1)) @ vv, lse]
try:
    print("merge equals softmax over all keys:", torch.allclose(merge(*halves)[0], scores.softmax(-1) @ v))
except NotImplementedError as error:
    print("not done yet:", error)

# %% [markdown]
# ## Part 2: the pass, and its backward
#
# `comm.get_rank()` and `comm.get_world_size()` say who you are; `comm.isend(tensor, dst=...)` and
# `comm.irecv(tensor, src=...)` return a work object whose `.wait()` completes the transfer. The forward below
# sends `block` to rank r+1 and returns the block of rank r−1. Its backward receives `grad_incoming`, the
# gradient of *your* loss with respect to the block you received: it belongs to rank r−1, who owns that block.
# Send it there, receive from rank r+1 the gradient it computed for the block you sent, and return two values,
# one per input of `forward`: that gradient (for `block`), then `grad_o` unchanged (for `o`).
#
# `o` rides along unchanged. Why: autograd runs a backward only for what the output depends on. With a causal
# mask rank 0 skips every block it receives, so without `o` its output would not depend on any pass, rank 0
# would never run `backward`, and rank 1 would wait forever to send it rank 0's gradient. Its gradient rides
# back unchanged too: returning `None` for `o` would stop the output's gradient at the pass, and the blocks
# merged before it would reach the gradients of q, k and v only through their log-sum-exp: wrong ones.


# %%
class PassRight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, block, o):
        if o is None:
            raise ValueError("PassRight got o=None: no block was computed before the pass, but at step 0 the "
                             "queries' own block is never entirely in the future (check the mask)")
        size = comm.get_world_size()
        right, left = (comm.get_rank() + 1) % size, (comm.get_rank() - 1) % size
        incoming = torch.empty_like(block)
        works = [comm.isend(block.contiguous(), dst=right), comm.irecv(incoming, src=left)]
        for work in works:
            work.wait()
        return incoming, o.clone()

    @staticmethod
    def backward(ctx, grad_incoming, grad_o):
# BEGIN SOLUTION
        rank, size = comm.get_rank(), comm.get_world_size()
        grad_block = torch.empty_like(grad_incoming)
        works = [comm.isend(grad_incoming.contiguous(), dst=(rank - 1) % size),   # back to the block's owner
                 comm.irecv(grad_block, src=(rank + 1) % size)]                    # the gradient of what I sent
        for work in works:
            work.wait()
        return grad_block, grad_o
# EXERCISE:         # YOUR CODE HERE (then return the gradient you received, and grad_o unchanged)
# EXERCISE:         raise NotImplementedError("send grad_incoming to rank r-1, receive the gradient of your block from r+1")
# END SOLUTION


# %% [markdown]
# ## Part 3: the ring loop
#
# At each of the G steps: the queries against the block you hold (masked, or skipped, when causal), merged into
# what you have; then, except after the last step, pass what you hold on with `PassRight.apply` (it takes
# the block and `o`, and returns the block that arrived and `o`). With one rank there is
# nothing to pass. (The library's `ring_attention` also overlaps each pass with the computation; here the pass
# waits, to keep the loop short.)


# %%
def ring_attention_forward(q, k, v, causal=False):
# BEGIN SOLUTION
    rank, size = comm.get_rank(), comm.get_world_size()
    length = q.shape[-2]
    q_pos = torch.arange(rank * length, (rank + 1) * length)
    o = lse = None
    kv = torch.stack([k, v])                                     # one message per step: keys and values
    for step in range(size):
        owner = (rank - step) % size                             # whose block this rank holds now
        k_pos = torch.arange(owner * length, (owner + 1) * length)
        mask = k_pos.unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):                 # a block entirely in the future is skipped
            o_block, lse_block = block_attention(q, kv[0], kv[1], mask)
            o, lse = (o_block, lse_block) if o is None else merge(o, lse, o_block, lse_block)
        if step < size - 1:                                      # step 0 is never skipped: o exists
            kv, o = PassRight.apply(kv, o)
    return o
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("G steps: attend to the block you hold, merge, pass it on with PassRight")
# END SOLUTION


# %% [markdown]
# Try it on `RANKS` simulated ranks against full attention, causal: the outputs, and the gradient of the keys
# (which needs `PassRight.backward`: most of a rank's key gradient comes from the other ranks' queries).

# %%
seq = RANKS * 4
q, k, v = (torch.randn(1, 2, seq, 8, generator=g, dtype=torch.float64) for _ in range(3))


def rank_fn(r, n):
    mine = [t[..., r * 4:(r + 1) * 4, :].clone().requires_grad_() for t in (q, k, v)]
    out = ring_attention_forward(*mine, causal=True)
    out.sum().backward()
    return out.detach(), mine[1].grad


k_leaf = k.clone().requires_grad_()
expected = full_attention(q, k_leaf, v, True)
expected.sum().backward()
try:
    outputs, dks = zip(*comm.simulate(rank_fn, RANKS).results)
    print("equal to full attention:", torch.allclose(torch.cat(outputs, dim=-2), expected))
    print("gradient of k equal to full attention's:", torch.allclose(torch.cat(dks, dim=-2), k_leaf.grad))
except comm.SimulatorError as error:
    print(str(error).strip().splitlines()[-1])

# %% [markdown]
# ## The grader

# %%
report = check_ring_attention(merge, ring_attention_forward)
