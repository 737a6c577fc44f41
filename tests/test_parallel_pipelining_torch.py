"""PyTorch's torch.distributed.pipelining on coursekit's stages and micro-batches: equal to one process and to
coursekit's executor (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, on CPU with gloo).

Every check here was seen failing on a planted bug, named in its docstring.
"""

import pytest

import coursekit
from coursekit.models import TeacherData, tiny_mlp
from coursekit.train import train
from coursekit.measure.verify import compare
from pipeline_support import run_all

TIMEOUT = 120.0


def _config(schedule, m, batch=8, v=1, model="transformer"):
    transformer = model == "transformer"
    return dict(model=model, **({} if transformer else {"data": TeacherData()}), schedule=schedule, micro_batches=m,
                stages_per_rank=v, global_batch=batch, steps=2, optimizer="adam", lr=1e-3 if transformer else 1e-2)


CONFIGS = {
    2: [_config("gpipe", 1), _config("gpipe", 4), _config("1f1b", 2), _config("1f1b", 4, batch=12),
        _config("interleaved", 2, v=2), _config("interleaved", 4, v=2)],
    3: [_config("1f1b", 3, batch=9), _config("interleaved", 6, batch=12, v=2, model=lambda: tiny_mlp(n_layers=6))],
    4: [_config("gpipe", 8), _config("1f1b", 4), _config("interleaved", 4, v=2, model=lambda: tiny_mlp(n_layers=8))],
}


@pytest.fixture(scope="module")
def runs():
    return run_all(("torch_pipeline", "pipeline"), CONFIGS, TIMEOUT)


def _whole(ranks: list[list[dict]]) -> list[dict]:
    """A run of stages seen as one process: every rank's parameters and gradients, the last stage's output."""
    steps = []
    for records in zip(*ranks):
        merged = {"loss": records[0]["loss"], "grads": {}, "params": {},
                  "output": next(r["output"] for r in records if r["output"] is not None)}
        for record in records:
            merged["grads"].update(record["grads"].tensors)
            merged["params"].update(record["params"].tensors)
        steps.append(merged)
    return steps


def test_torch_pipelining_equals_one_process_and_coursekits_executor(runs):
    """The same stages, micro-batches and scaled loss: loss, output, every gradient and weight after 2 Adam steps.

    Planted bugs seen failing: ``scale_grads=True`` (torch divides the already-scaled gradients by m again:
    ``gpipe p=2 m=4: step 0, grad 'tok_emb.weight'``: 0.0051 for 0.0204; interleaved likewise); the tied
    embedding/head gradient not summed after torch's step (torch does not do it: ``gpipe p=2 m=1``)."""
    for p, (references, results) in runs.items():
        for i, config in enumerate(CONFIGS[p]):
            label = f"{config['schedule']} p={p} m={config['micro_batches']} v={config['stages_per_rank']}"
            theirs = [results[r][i][0]["records"] for r in range(p)]
            ours = [results[r][i][1]["records"] for r in range(p)]
            report = compare(references[i], theirs)
            assert report.ok, f"torch, {label}: {report}"
            report = compare(_whole(ours), theirs)
            assert report.ok, f"torch against coursekit's executor, {label}: {report}"


def _refused(rank, world_size):
    out = []
    for config in (dict(micro_batches=2), dict(micro_batches=3, global_batch=8)):
        try:
            train(rank, world_size, "torch_pipeline", model="transformer", schedule="1f1b", steps=1, **config)
            out.append("ran")
        except ValueError as error:
            out.append(str(error))
    return out


def test_what_torch_refuses_and_coursekit_runs():
    """torch's 1F1B needs m >= p; its stages receive into buffers shaped by the first micro-batch, so uneven
    micro-batches are refused here with a sentence (coursekit's executor runs both: see test_parallel_pipeline).

    Planted bug seen failing: the uneven check removed (rank 1 dies: "Expected input batch_size (93) to match
    target batch_size (62)", rank 0 hangs in torch's ``_wait_batch_p2p`` until the launch times out)."""
    messages = coursekit.launch(_refused, 4, timeout=TIMEOUT)[0]
    assert "Number of microbatches (2) must be greater than or equal to the number of stages (4)" in messages[0]
    messages = coursekit.launch(_refused, 2, timeout=30)[0]
    assert "micro-batches must be of one size; got [3, 3, 2]" in messages[1], messages[1]
