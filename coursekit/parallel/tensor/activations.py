"""Activation memory of one tensor-parallel block: the course's own count, and Korthikanti et al.'s Table 2.

Tensor parallelism divides the weights by ``t`` (chapter 05 measures that). It divides the activations
only in part: attention's heads and the MLP's hidden features are split, but every rank runs the two
LayerNorms on the whole ``(b, s, h)`` input and feeds the whole normalized tensor to the column-parallel
layers, so what autograd keeps of those regions is *replicated*, identical on every rank. Megatron's
sequence parallelism (chapter 06, :func:`~coursekit.parallel.sequence.megatron_sp_saved_bytes`) splits
those regions too, along the sequence.

Two counts, kept apart:

* :func:`tensor_parallel_saved_bytes` -- what chapter 05's :func:`~coursekit.parallel.tensor.parallelize_block`
  really saves for backward on each rank, element by element: fp32 here, PyTorch's fused attention
  (``scaled_dot_product_attention``: q, k, v, the output and one log-sum-exp per head and token, never the
  s × s scores), no dropout. Tests measure it exactly.
* :func:`korthikanti_table2_bytes` -- the paper's Table 2, for *its* layer: 16-bit activations, 1-byte
  dropout masks in three places, and attention that keeps the softmax (and its dropout) as a × s × s
  per sequence. A model of someone else's kernels, not a measurement of these.

The two agree on the structure -- 16 elements of ``b·s·h`` per layer when ``d_ff = 4h``, of which 4 (the
norms' inputs, the qkv and fc inputs) are the ones plain tensor parallelism replicates -- and differ in
the element size (4 bytes here, 2 there) and in what the kernels add around it: per token the course keeps
4 more values (the norms' mean and 1/std, which the paper leaves out) and ``a`` log-sum-exps, where the
paper adds ``5·a·s`` bytes of scores and their dropout and ``2h`` bytes of the other two dropout masks.

    >>> tensor_parallel_saved_bytes(2, 32, 64, 4, 256, 2) // (2 * 32 * 4)   # elements per token, t = 2
    646
"""

from __future__ import annotations

__all__ = ["tensor_parallel_saved_bytes", "korthikanti_table2_bytes"]


def tensor_parallel_saved_bytes(batch: int, seq_len: int, d_model: int, n_heads: int, d_ff: int, size: int,
                                itemsize: int = 4) -> int:
    """Bytes one :func:`~coursekit.parallel.tensor.parallelize_block` saves for backward on each rank (activations).

    Per token, elements, counted as :func:`~coursekit.parallel.sequence.megatron_sp_saved_bytes` counts them:

    * replicated, whole on every rank: the two LayerNorms' inputs with their mean and 1/std (``2h + 4``) and
      the inputs of ``qkv`` and ``fc`` -- the norms' outputs, read whole by the column-parallel layers
      (``2h``): ``4h + 4``;
    * split ``t`` ways (this rank's heads, this rank's hidden features): q, k, v (``3h``), attention's output,
      which is ``proj``'s input (``h``), its log-sum-exp per head (``a``), the GELU's input and output, the
      second of them ``out``'s input (``2·d_ff``): ``(4h + 2·d_ff + a) / t``.

    At ``t = 1`` this is the dense block's ``(8h + 2·d_ff + a + 4)·b·s``; with sequence parallelism the
    replicated part is split too (by tokens) and the whole becomes ``1/t`` of that. Raises ``ValueError``
    when ``t`` does not divide the heads or the MLP width (the ranks would hold unequal shares).

        >>> tensor_parallel_saved_bytes(2, 32, 64, 4, 256, 1) == (8 * 64 + 2 * 256 + 4 + 4) * 2 * 32 * 4
        True
    """
    for what, n in (("heads", n_heads), ("MLP width", d_ff)):
        if n % size:
            raise ValueError(f"the {what} ({n}) does not divide by t = {size}: the ranks hold unequal shares.")
    replicated = 4 * d_model + 4
    split = (4 * d_model + 2 * d_ff + n_heads) // size  # h/t of the width: a/t whole heads of h/a each
    return (replicated + split) * batch * seq_len * itemsize


def korthikanti_table2_bytes(batch: int, seq_len: int, d_model: int, n_heads: int, size: int = 1) -> dict[str, int]:
    """Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), Table 2.

    Bytes one transformer layer stores for backward, per rank, in the paper's setting: 16-bit activations,
    1-byte dropout masks, attention that keeps its softmax output and that output's dropout (s, b, h, a, t
    the paper's letters: ``seq_len``, ``batch``, ``d_model``, ``n_heads``, ``size``):

    =========================================  ==========================
    ``"dense"``            no parallelism      ``sbh(34 + 5as/h)``
    ``"tensor"``           tensor parallel     ``sbh(10 + 24/t + 5as/(ht))``
    ``"sequence_tensor"``  tensor + sequence   ``sbh(34/t + 5as/(ht))``
    =========================================  ==========================

    The 34: 16 elements of ``sbh`` at 2 bytes (attention: the qkv input, Q, K, V, the projection's input;
    MLP: the fc input, the GeLU's input, 4, and fc2's, 4; the two LayerNorms' inputs) and 2 dropout masks
    at 1 byte. Plain tensor parallelism leaves 10 of them whole: the 4 elements of the LayerNorm regions
    and the first matmuls' inputs, and the 2 masks after the row-parallel layers. The ``5as/h``: the
    a × s × s scores per sequence, the softmax output and its dropout output (2 bytes each) and the mask.
    The forms as the paper states them (arXiv 2205.05198, section 4; the same three in AWS Neuron's
    "Activation Memory Reduction" guide); the general model with recomputation and other element sizes is
    :func:`coursekit.costmodel.activation_bytes_per_layer`.

    Not what the course's blocks keep: they run fp32 without dropout, and their fused attention never
    holds the scores (:func:`tensor_parallel_saved_bytes` counts what they do keep). Requires ``t`` to
    divide the heads and the width, as the paper's split does.

        >>> korthikanti_table2_bytes(2, 32, 64, 4, 2)["sequence_tensor"] * 2 == korthikanti_table2_bytes(2, 32, 64, 4)["dense"]
        True
    """
    if size < 1 or n_heads % size or d_model % size:
        raise ValueError(f"t = {size} must be >= 1 and divide the heads ({n_heads}) and the width ({d_model}).")
    sbh, scores = seq_len * batch * d_model, 5 * n_heads * seq_len * seq_len * batch  # sbh · 5as/h
    return {"dense": 34 * sbh + scores,
            "tensor": 10 * sbh + (24 * sbh + scores) // size,
            "sequence_tensor": (34 * sbh + scores) // size}
