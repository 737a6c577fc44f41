"""ZeRO's flat buffer lives where the parameters live (issue 24 section 4: the same code on GPUs).

On a GPU rank the parameters are on ``cuda:LOCAL_RANK`` (``coursekit.train`` moves the model to
``coursekit.device()``); a flat buffer made on the CPU would silently move every parameter there and the
first forward on a CUDA batch would fail. This machine has no GPU, so the test uses PyTorch's ``meta`` device:
a device that is not the CPU, which every CPU build has (tensors with shapes and dtypes but no data).
"""

import torch.nn as nn

from coursekit.parallel.data import lay_flat


def test_lay_flat_keeps_the_parameters_device():
    """Planted bug, seen failing: ``torch.empty(...)`` without ``device=`` in ``lay_flat`` (the buffer landed
    on cpu; lay_flat then failed copying the meta parameters into it: "Cannot copy out of meta tensor", the
    CPU's word for "this buffer is not on the parameters' device")."""
    layer = nn.Linear(3, 5, device="meta")
    named = list(layer.named_parameters())
    params, _, flat, views = lay_flat(named)
    assert flat.device.type == "meta", f"the flat buffer is on {flat.device}, its parameters were on meta"
    assert flat.numel() == 3 * 5 + 5  # weight (5 x 3) and bias (5), end to end
    for p, (offset, n) in zip(params, views):
        assert p.device.type == "meta", f"a parameter moved to {p.device}"
        assert p.numel() == n
