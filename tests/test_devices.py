"""One device-aware default: gloo for CPU tensors, and with a GPU per rank NCCL for CUDA tensors beside it.

There is no GPU here, so the GPU count is monkeypatched (``torch.cuda.is_available`` / ``device_count``) and the
choices are checked against the rule itself: a GPU for each rank on the machine -> ``"cpu:gloo,cuda:nccl"``
and each rank on ``cuda:<local rank>``; fewer -> gloo, the CPU.

Planted bugs, seen failing:
* ``default_backend`` choosing NCCL alone (``"nccl"``) -> chapter 00's CPU tensors would fail: the test of the
  mixed string fails;
* ``gpus > world_size`` instead of ``>=`` -> 2 GPUs for 2 ranks gives gloo;
* ``device_for`` ignoring the backend (a GPU whenever there is one) -> a gloo job on a GPU machine gets cuda;

Not checkable without a GPU: that the launcher's ranks set their GPU under the mixed backend (``make gpu-check``).
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit.comm.devices import MIXED, default_backend, device, device_for, uses_nccl


def _gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
@pytest.mark.parametrize("ranks", [2, 4])
def test_the_backend_follows_the_gpus(monkeypatch, gpus, ranks):
    _gpus(monkeypatch, gpus)
    want = "cpu:gloo,cuda:nccl" if gpus >= ranks else "gloo"
    assert default_backend(ranks) == want
    assert coursekit.resolve_backend("auto", ranks) == want
    if gpus < ranks:
        with pytest.raises(ValueError, match="needs one GPU per rank"):
            coursekit.resolve_backend("nccl", ranks)
        with pytest.raises(ValueError, match="needs one GPU per rank"):
            coursekit.resolve_backend(MIXED, ranks)
    else:
        assert coursekit.resolve_backend("nccl", ranks) == "nccl"


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_gets_its_own_gpu_under_nccl_and_the_cpu_otherwise(gpus, ranks):
    backend = "cpu:gloo,cuda:nccl" if gpus >= ranks else "gloo"
    places = [device_for(backend, r, gpus) for r in range(ranks)]
    if gpus >= ranks:
        assert places == [torch.device("cuda", r) for r in range(ranks)]   # one GPU each, none shared
    else:
        assert places == [torch.device("cpu")] * ranks
    assert device_for("gloo", 1, 8) == torch.device("cpu")                 # gloo asked for: the CPU, GPUs or not
    assert device_for("nccl", 9, 8) == torch.device("cuda", 1)             # a second node's local rank 9? modulo


def test_uses_nccl_reads_every_spelling():
    assert uses_nccl("nccl") and uses_nccl(MIXED) and not uses_nccl("gloo")


def _where(rank, world_size):
    t = torch.ones(1, device=device())
    torch.distributed.all_reduce(t)
    return str(device()), t.item()


def test_on_cpu_ranks_the_device_is_the_cpu():
    """A real 2-rank gloo launch: every rank's device is the CPU and a collective on it works."""
    assert coursekit.launch(_where, 2) == [("cpu", 2.0), ("cpu", 2.0)]
    assert device() == torch.device("cpu")                                 # no process group: the CPU
