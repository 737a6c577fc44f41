"""Checkpoints that reshard (torch.distributed.checkpoint): saved under one layout, resumed under another.

Planted bugs, seen failing (each at its test):
* Adam's step counter not saved -> every resumed curve differs from step 2 on (the bias correction restarts);
* qkv saved whole instead of as q, k, v -> tp2's checkpoint read by one process has the wrong rows (and tp2 ->
  pp2 diverges);
* the checkpoint written straight into step-000004/ (no .tmp) -> the torn-checkpoint test fails;
* latest() counting .tmp directories -> the torn-checkpoint test resumes from the torn one.
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit import LaunchTimeout, RankError
from coursekit.capstone import Config, one_process_losses, run
from coursekit.capstone import checkpoint
from coursekit.comm.mesh import Mesh
from coursekit.models import LanguageData, tiny_transformer
from coursekit.parallel.hybrid import mesh_shape
from coursekit.parallel.tensor import gather_dense, parallelize_transformer

STEPS, SAVED_AT = 4, 2


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """One process, chapter 02's loop: the curve every layout must reproduce."""
    return one_process_losses(Config(batch=8, steps=STEPS))


def _train(directory, steps: int, resume: bool, **degrees) -> dict:
    config = Config(batch=8, steps=steps, quiet=True, checkpoint_dir=str(directory), resume=resume, **degrees)
    return coursekit.launch(run, config.world_size, config, timeout=120)[0]


PAIRS = {  # saved under, resumed under
    "dp2xtp2-to-dp4": (dict(dp=2, tp=2), dict(dp=4)),
    "tp2-to-pp2": (dict(tp=2), dict(pp=2, microbatches=2)),
    "pp2-to-dp2xtp2": (dict(pp=2, microbatches=2), dict(dp=2, tp=2)),
    "tp4-to-one": (dict(tp=4), {}),
}


@pytest.mark.parametrize("pair", PAIRS)
def test_a_resumed_run_under_another_layout_continues_the_curve(reference, tmp_path, pair):
    """Steps 1-2 under one layout, saved; steps 3-4 under another, from the checkpoint: the one-process curve.

    Planted bug, seen failing: Adam's step counter left out of the checkpoint (step 3 differs: Adam's bias
    correction starts again). Also seen: qkv saved whole (every pair with tensor parallelism on one side).
    """
    before, after = PAIRS[pair]
    first = _train(tmp_path, SAVED_AT, False, **before)
    second = _train(tmp_path, STEPS, True, **after)
    assert second["first_step"] == SAVED_AT
    for step, got in zip(range(STEPS), first["losses"] + second["losses"]):
        assert abs(got - reference[step]) <= 1e-5 * reference[step], f"step {step}: {got} against {reference[step]}"


def _save_tp(rank, world_size, directory):
    """tp = world_size: save one Adam step's state; return the dense parameters and exp_avg, gathered."""
    mesh = Mesh(mesh_shape(tp=world_size))
    model = parallelize_transformer(tiny_transformer(seed=3), mesh["tp"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.loss(*LanguageData(seed=3).batch(0, 4)).backward()
    optimizer.step()
    from coursekit.parallel.tensor import dense_name, shard_dim
    shards = [(dense_name(f"{m}.{n}" if m else n), p, shard_dim(module, n))
              for m, module in model.named_modules() for n, p in module.named_parameters(recurse=False)]
    checkpoint.save(directory, 1, shards, optimizer, checkpoint.device_mesh(mesh))
    for p in model.parameters():
        p.grad = optimizer.state[p]["exp_avg"].clone()
    return gather_dense(model), gather_dense(model, grads=True)


def _load_one(rank, world_size, directory):
    mesh = Mesh(mesh_shape())
    model = tiny_transformer(seed=99)  # other weights: all must come from the checkpoint
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    shards = [(n, p, None) for n, p in model.named_parameters()]
    step, _, _ = checkpoint.load(directory, shards, optimizer, checkpoint.device_mesh(mesh))
    return step, {n: p.detach() for n, p in model.named_parameters()}, \
        {n: optimizer.state[p]["exp_avg"] for n, p in model.named_parameters()}, \
        {n: optimizer.state[p]["step"].item() for n, p in model.named_parameters()}


def test_tensor_parallel_shards_read_back_as_the_dense_tensors(tmp_path):
    """Saved by 2 tensor-parallel ranks, loaded by one process: every weight and Adam moment is the dense one.

    The expected tensors are the saving ranks' own shards gathered (``gather_dense``), not the checkpoint's.
    Planted bug, seen failing: qkv saved whole (its local rows are q, k, v of this rank's heads, not a block).
    """
    params, moments = coursekit.launch(_save_tp, 2, tmp_path, timeout=120)[0]
    step, loaded, loaded_moments, steps = coursekit.launch(_load_one, 1, tmp_path, timeout=120)[0]
    assert step == 1 and set(steps.values()) == {1.0}
    assert set(loaded) == set(params)
    for name in params:
        assert torch.equal(loaded[name], params[name]), name
        assert torch.equal(loaded_moments[name], moments[name]), name


def test_a_job_killed_while_saving_resumes_from_the_last_complete_checkpoint(reference, tmp_path, monkeypatch,
                                                                            capfd):
    """Rank 1 is SIGKILLed inside the save after step 4; the next start resumes from step 2 and says so.

    Planted bugs, seen failing: the checkpoint written straight into its final directory (no ``.tmp``);
    latest() counting ``.tmp`` directories (it resumed from the torn one).
    """
    monkeypatch.setenv(checkpoint.KILL_ENV, "1:4")
    config = Config(dp=2, batch=8, steps=STEPS, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    with pytest.raises((RankError, LaunchTimeout)):
        coursekit.launch(run, 2, config, timeout=30)
    monkeypatch.delenv(checkpoint.KILL_ENV)
    assert [p.name for p in checkpoint.incomplete(tmp_path)] == ["step-000004.tmp"]
    assert checkpoint.latest(tmp_path)[0] == 2
    capfd.readouterr()
    resumed = coursekit.launch(run, 2, Config(dp=2, batch=8, steps=STEPS, checkpoint_dir=str(tmp_path), resume=True),
                               timeout=120)[0]
    said = capfd.readouterr().out
    assert "ignoring" in said and "step-000004.tmp" in said and "resuming from" in said, said
    assert resumed["first_step"] == 2
    for step, got in zip(range(2, STEPS), resumed["losses"]):
        assert abs(got - reference[step]) <= 1e-5 * reference[step]


def test_refused_before_anything_starts():
    from coursekit.capstone import check
    with pytest.raises(ValueError, match="zero = 0 to checkpoint"):
        check(Config(dp=2, zero=1, checkpoint_dir="/tmp/x"))
    with pytest.raises(ValueError, match="resume = True needs checkpoint_dir"):
        check(Config(resume=True))
