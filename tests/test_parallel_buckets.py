"""coursekit.parallel.data.buckets: one bucket rule, DDP's megabytes everywhere, and each strategy's default
keeps the element count the chapters were measured with."""

import pytest
import torch

import coursekit
from coursekit.models import count_parameters, tiny_mlp, tiny_transformer
from coursekit.parallel.data.buckets import DDP_BUCKET_CAP_MB, bucket_capacity, megabytes
from coursekit.parallel.data import DataParallel
from coursekit.parallel.data import ZeRO
from coursekit.strategy import Setup, get_strategy
from coursekit.train import make_optimizer_fn

# The buckets of 25,000 float32 elements the course transformer had before the rule, in backward order
# (listed by the planted bug of tests/test_parallel_data_zero_defaults.py); 55,000: two.
TRANSFORMER_25K = [16_832, 20_672, 12_480, 16_640, 20_672, 17_536]
TRANSFORMER_55K = [49_984, 54_848]


def test_bucket_cap_mb_is_ddps_megabytes_for_any_dtype():
    """Planted bugs, seen failing: megabytes as 10**6 bytes ("assert 0.1 == (100000 / (2 ** 20))"), and a capacity
    counted in float32 elements whatever the dtype ("assert 262144 == ((2 ** 20) // 8)")."""
    assert megabytes(25_000) == 100_000 / 2**20 == 0.095367431640625
    assert megabytes(25_000, torch.float64) == 2 * megabytes(25_000)
    assert bucket_capacity(1.0, torch.zeros(1)) == 2**20 // 4
    assert bucket_capacity(1.0, torch.zeros(1, dtype=torch.float64)) == 2**20 // 8  # DDP counts bytes
    assert bucket_capacity(megabytes(25_000), torch.zeros(1)) == 25_000
    assert bucket_capacity(None, torch.zeros(1)) is None  # one bucket for everything
    assert bucket_capacity(1.0, torch.zeros(1), bucket_elements=7) == 7  # an element count overrides
    assert bucket_capacity(1e-9, torch.zeros(1)) == 1
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number of megabytes"):
        bucket_capacity(-1.0, torch.zeros(1))


def _strategy(name: str, model: torch.nn.Module, **options):
    return get_strategy(name)(Setup(model, make_optimizer_fn("adam", 1e-3), options=options))


def test_every_default_is_megabytes_and_keeps_its_bucket_sizes():
    """The wrappers default to DDP's 25 MB; the strategies to the megabytes of their old element counts.

    Planted bug, seen failing: "bucketed" defaulting to DDP's 25 MB like the wrappers ("bucketed / assert
    [104832] == [16832, 20672... 20672, 17536]": one bucket, nothing left to overlap with backward).
    """
    psi = count_parameters(tiny_transformer())
    assert len(DataParallel(tiny_transformer(seed=0)).buckets) == 1 == len(ZeRO(tiny_transformer(seed=0),
                                                                               torch.optim.SGD).buckets)
    for name in ("bucketed", "sharded_optimizer"):
        wrapped = _strategy(name, tiny_transformer(seed=0)).wrapped
        assert [b.buffer.numel() for b in wrapped.buckets] == TRANSFORMER_25K, name
        assert get_strategy(name).options["bucket_cap_mb"] == megabytes(25_000), name
    assert _strategy("zero1", tiny_transformer(seed=0)).zero.bucket_sizes == [psi]
    for name in ("zero2", "zero3"):
        assert _strategy(name, tiny_transformer(seed=0)).zero.bucket_sizes == TRANSFORMER_55K, name
        assert get_strategy(name).options["bucket_cap_mb"] == megabytes(55_000), name
    assert get_strategy("zero1").options["bucket_cap_mb"] == DDP_BUCKET_CAP_MB == 25.0
    assert get_strategy("torch_ddp").options["bucket_cap_mb"] == DDP_BUCKET_CAP_MB


def test_every_strategy_reads_the_options_one_way():
    """``bucket_elements`` overrides the megabytes; ``bucket_cap_mb=None`` is one bucket, for the strategies too.

    Planted bug, seen failing: ZeRO's strategies reading None as "use the stage's default" (the old
    reading): "assert [49984, 54848] == [104832]".
    """
    psi = count_parameters(tiny_transformer())
    assert [b.buffer.numel() for b in _strategy("bucketed", tiny_mlp(seed=0), bucket_elements=1088).wrapped.buckets] \
        == [4 + 256 + 64, 4096, 64 + 1024]
    assert [b.buffer.numel() for b in _strategy("bucketed", tiny_transformer(seed=0),
                                                bucket_cap_mb=None).wrapped.buckets] == [psi]
    assert _strategy("zero2", tiny_transformer(seed=0), bucket_cap_mb=None).zero.bucket_sizes == [psi]
    assert _strategy("zero2", tiny_mlp(seed=0), bucket_elements=1088).zero.bucket_sizes == [4 + 256 + 64, 4096,
                                                                                              64 + 1024]


def _ddp_caps(rank, world_size):
    model = tiny_transformer(seed=0)
    caps = [_strategy("torch_ddp", model).ddp.bucket_bytes_cap,
            _strategy("torch_ddp", tiny_transformer(seed=0), bucket_cap_mb=None).ddp.bucket_bytes_cap]
    return caps, sum(p.numel() * p.element_size() for p in model.parameters())


def test_torch_ddp_reads_none_as_one_bucket_too():
    """Planted bug, seen failing: None passed on to DDP, which reads it as its 25 MB: "assert 26214400 == 419328"."""
    (default, none), model_bytes = coursekit.launch(_ddp_caps, 2, timeout=180)[0]
    assert default == 25 * 2**20
    assert none == model_bytes


def test_docstring_examples():
    import doctest

    from coursekit.parallel.data import buckets

    failures, tried = doctest.testmod(buckets)
    assert tried > 0 and failures == 0
