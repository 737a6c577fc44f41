"""The course models and data: deterministic, small, and the transformer really learns."""

import math

import pytest
import torch

from coursekit.models import LanguageData, TeacherData, count_parameters, loss_fn, tiny_mlp, tiny_transformer


def _same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_same_seed_same_weights_and_global_rng_untouched():
    state = torch.get_rng_state()
    assert _same(tiny_transformer(seed=3), tiny_transformer(seed=3))
    assert _same(tiny_mlp(seed=3), tiny_mlp(seed=3))
    assert torch.equal(state, torch.get_rng_state()), "building a model must not consume the global RNG"
    assert not _same(tiny_transformer(seed=3), tiny_transformer(seed=4))
    assert not _same(tiny_mlp(seed=3), tiny_mlp(seed=4))


def test_transformer_shapes_size_and_tied_head():
    model = tiny_transformer(seed=0)
    assert model.head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "head.weight" not in names  # a tied weight is one parameter
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())
    untied = tiny_transformer(seed=0, tie_weights=False)
    assert count_parameters(untied) == count_parameters(model) + 16 * 64
    assert count_parameters(model) == 104_832
    assert model(torch.zeros(3, 10, dtype=torch.long)).shape == (3, 10, 16)
    assert tiny_mlp()(torch.zeros(5, 16)).shape == (5, 4)


def test_bad_sizes_are_rejected_clearly():
    with pytest.raises(ValueError, match="d_model <= 128"):
        tiny_transformer(d_model=256)
    with pytest.raises(ValueError, match="max_seq_len"):
        tiny_transformer(max_seq_len=8)(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible"):
        tiny_transformer(d_model=64, n_heads=5)


def test_data_is_a_pure_function_of_seed_and_step():
    data = LanguageData(seq_len=16)
    x1, y1 = data.batch(5, 8)
    x2, y2 = LanguageData(seq_len=16).batch(5, 8)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, data.batch(6, 8)[0])
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    # every token from the third on is one of the two successors of the two before it
    tokens = torch.cat([x1, y1[:, -1:]], dim=1)
    for i in range(2, tokens.shape[1]):
        allowed = data.successors[tokens[:, i - 2], tokens[:, i - 1]]
        assert (allowed == tokens[:, i:i + 1]).any(dim=1).all()
    tx, ty = TeacherData().batch(0, 6)
    assert torch.equal(tx, TeacherData().batch(0, 6)[0]) and ty.shape == (6,)
    assert 0.5 < data.loss_floor < math.log(16)


def test_transformer_learns_the_language():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in every rank; also faster for this small model on a busy machine
    try:
        model, data = tiny_transformer(seed=0), LanguageData()
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
        losses = []
        for step in range(60):
            x, y = data.batch(step, 32)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    assert abs(losses[0] - math.log(16)) < 0.1      # starts at chance
    assert sum(losses[-10:]) / 10 < losses[0] - 0.4  # and visibly learns (0.5 nats in 60 steps here)
