"""The pipeline executor (coursekit.parallel.pipeline.executor): every schedule equal to one process, memory and traffic
measured against their formulas, one span per action, bad schedules refused before anything runs.

Every check here was seen failing on a planted bug, named in its docstring.
"""

import pytest

import coursekit
import coursekit.parallel.pipeline  # noqa: F401  (registers "pipeline")
from coursekit.models import TeacherData, tiny_mlp
from coursekit.parallel.pipeline import Action, Schedule, ScheduleError, make_schedule, plan
from coursekit.train import train
from coursekit.comm.traffic import Traffic
from coursekit.measure.verify import compare
from pipeline_support import run_all

TIMEOUT = 120.0
D, V, S = 64, 16, 31  # the course transformer: d_model, vocabulary, tokens per sample
STEPS = 2


def mlp(n_layers):
    """``tiny_mlp`` with ``n_layers`` layers (every boundary carries 64 features)."""
    return lambda: tiny_mlp(n_layers=n_layers)


def _config(schedule, m, batch=8, v=1, model="transformer", **extra):
    transformer = model == "transformer"
    return dict(model=model, **({} if transformer else {"data": TeacherData()}), schedule=schedule, micro_batches=m,
                stages_per_rank=v, global_batch=batch, steps=STEPS, optimizer="adam", lr=1e-3 if transformer else 1e-2,
                count_traffic=True, **extra)


# world size -> configurations, run in one launch: every schedule, m from 1 to 8, m < p and m not divisible by p
CONFIGS = {
    1: [_config("interleaved", 2, v=2, model=mlp(2))],  # two stages on one rank: handed over, not sent
    2: [_config("gpipe", 1), _config("gpipe", 3, batch=7), _config("1f1b", 1), _config("1f1b", 5, batch=7),
        _config("zb_h1", 2), _config("zb_h1", 3, freeze=("pos_emb.weight",)), _config("interleaved", 2, v=2), _config("interleaved", 4, v=2),
        _config("1f1b", 4, trace=True), _config("zb_h1", 4, trace=True)],
    3: [_config("gpipe", 4), _config("1f1b", 2), _config("1f1b", 4), _config("zb_h1", 4, batch=11),
        _config("interleaved", 3, v=2, model=mlp(6)), _config("interleaved", 6, v=2, batch=12, model=mlp(6))],
    4: [_config("gpipe", 8), _config("1f1b", 3), _config("1f1b", 8), _config("zb_h1", 4), _config("zb_h1", 5),
        _config("interleaved", 4, v=2, model=mlp(8)), _config("interleaved", 8, v=2, model=mlp(8)),
        _config("1f1b", 4, batch=16, model=mlp(4)), _config("gpipe", 4, batch=16, model=mlp(4)),
        _config("zb_h1", 4, batch=16, model=mlp(4)), _config("interleaved", 4, v=2, batch=16, model=mlp(8))],
}


@pytest.fixture(scope="module")
def runs():
    """``{world size: (references, results)}``, ``results[rank][config]`` the dict of ``train``."""
    return {p: (refs, [[r[0] for r in rank] for rank in results])
            for p, (refs, results) in run_all(("pipeline",), CONFIGS, TIMEOUT).items()}


def _each(runs):
    for world_size, (references, results) in runs.items():
        for i, config in enumerate(CONFIGS[world_size]):
            yield world_size, config, references[i], [results[r][i] for r in range(world_size)]


def _label(p, config):
    return f"{config['schedule']} p={p} m={config['micro_batches']} v={config['stages_per_rank']}"


def test_every_schedule_equals_one_process(runs):
    """Loss, output, every gradient and every weight after 2 Adam steps, p = 1-4, m = 1-8 (m < p, m not a
    multiple of p, uneven micro-batches), the tied transformer (once with a frozen position embedding) and deeper
    MLPs for v = 2.

    Planted bugs seen failing: W overwriting ``.grad`` instead of adding (``zb_h1 p=2 m=2: step 0, grad
    'tok_emb.weight'``); B in a split schedule computing the weight gradients too (counted twice: got 0.0408,
    expected 0.0204); the micro-batch loss left unscaled (``interleaved p=1 m=2: step 0, loss``: 2.80 for 1.40);
    the tied embedding/head gradient not summed (``gpipe p=2 m=1: grad 'tok_emb.weight', rank 0``); a stage's
    input taken from the stage before it on the same rank without detaching it (``interleaved p=1``: rank 0 fails,
    "grad can be implicitly created only for scalar outputs")."""
    for p, config, reference, ranks in _each(runs):
        report = compare(reference, [r["records"] for r in ranks])
        assert report.ok, f"{_label(p, config)}: {report}"


def test_activations_held_at_the_peak_match_the_formulas(runs):
    """Measured through weak references to what autograd saved: GPipe holds m micro-batches, 1F1B min(p − r, m),
    ZB-H1 and interleaved what their plan says (to their last W; in chunks for v = 2). The bytes: the next test.

    Planted bugs seen failing: the stage input kept after its backward (``interleaved p=1 m=2 v=2, rank 0: 3 held,
    formula 2``); autograd's graph retained after a plain B (the same: nothing freed before the step ends); the
    executor's saved-tensor hook keeping the tensor itself, not an alias (``zb_h1 p=2 m=3 v=1, rank 1: 3 held,
    formula 2``: a node tied to its own output outlives W)."""
    for p, config, _, ranks in _each(runs):
        name, m, v = config["schedule"], config["micro_batches"], config["stages_per_rank"]
        planned = plan(make_schedule(name, p, m, v)).peak_in_flight
        for r, result in enumerate(ranks):
            formula = {"gpipe": m, "1f1b": min(p - r, m)}.get(name, planned[r])
            assert result["peak_in_flight"] == formula == planned[r], (
                f"{_label(p, config)}, rank {r}: {result['peak_in_flight']} held, formula {formula}, plan {planned[r]}")


def _held_by_the_schedule(schedule, rank, saved, after_b):
    """Replay ``rank``'s actions: F holds ``saved[s]`` bytes for its micro-batch, a split B leaves ``after_b[s]``
    (what W needs), W (or an unsplit B) frees the lot. Returns (most micro-batches held, most bytes held)."""
    held, most, most_bytes = {}, 0, 0
    for a in schedule.actions[rank]:
        key = (a.stage, a.micro_batch)
        if a.op == "F":
            held[key] = saved[a.stage]
        elif a.op == "B" and schedule.split_backward:
            held[key] = after_b[a.stage]
        elif a.op in ("B", "W"):
            del held[key]
        most, most_bytes = max(most, len(held)), max(most_bytes, sum(held.values()))
    return most, most_bytes


def test_activation_bytes_at_the_peak_follow_the_schedule(runs):
    """The MLP cut one layer a stage on 4 ranks, m = 4, b = 4 samples a micro-batch: GPipe, 1F1B, ZB-H1, interleaved
    (v = 2). Replaying each rank's action list with what each micro-batch holds gives the peak count and bytes per
    rank. A middle stage's F saves its input and GELU's input, 4·b·(64 + 64) bytes (float32), stage 0's only
    GELU's input, 4·b·64 (the batch itself is not counted). After a split B, W needs the linear layer's input X
    and the gradient at its output dY (4·b·64 each); GELU's input goes with the part of the graph above the
    layer. Stage 0's B does nothing: its W keeps the whole graph and the output gradient, 4·b·(64 + 64) too. The
    last stage (loss) is left out of the bytes. ZB-H1 holds more bytes than 1F1B on every rank: each
    micro-batch until its W.

    Planted bug seen failing: the gradients B keeps for W not counted (``zb_h1 p=4 m=4 v=1, rank 0: 4096 bytes,
    replayed 5120``)."""
    b, peaks = 4, {}
    for config, ranks in zip(CONFIGS[4][-4:], [[runs[4][1][r][i] for r in range(4)] for i in range(-4, 0)]):
        name, m, v = config["schedule"], config["micro_batches"], config["stages_per_rank"]
        schedule = make_schedule(name, 4, m, v)
        saved = [4 * b * (64 if s == 0 else 128) for s in range(schedule.n_stages)]
        after_b = [4 * b * (64 + 64)] * schedule.n_stages
        for r in range(4):
            count, nbytes = _held_by_the_schedule(schedule, r, saved, after_b)
            assert ranks[r]["peak_in_flight"] == count, f"{_label(4, config)}, rank {r}: {ranks[r]['peak_in_flight']}"
            if schedule.n_stages - 1 not in schedule.stages_of(r):
                assert ranks[r]["peak_activation_bytes"] == nbytes, (
                    f"{_label(4, config)}, rank {r}: {ranks[r]['peak_activation_bytes']} bytes, replayed {nbytes}")
                peaks.setdefault(name, []).append(nbytes)
    assert all(zb > base for zb, base in zip(peaks["zb_h1"], peaks["1f1b"])), peaks


def test_elements_sent_match_the_formula(runs):
    """Each of the p·v − 1 stage boundaries carries every sample's activations forward and their gradient back:
    2·(p·v − 1)·B·a elements a step (a = S·d for the transformer, 64 for the MLP), plus the tied embedding's
    gradient both ways (2·V·d) when first and last stage are on different ranks; nothing on one rank. Shape headers
    are control traffic.

    Planted bug seen failing: shape headers counted as payload (``gpipe p=2 m=1: 67592 elements``, not 67584)."""
    for p, config, _, ranks in _each(runs):
        traffic = Traffic.merge([r["traffic"] for r in ranks])
        n_stages, batch = p * config["stages_per_rank"], config["global_batch"]
        transformer = config["model"] == "transformer"
        crossing = n_stages - 1 if p > 1 else 0  # on one rank a stage hands its output over, nothing is sent
        per_step = 2 * crossing * batch * (S * D if transformer else 64) + (2 * V * D if transformer and p > 1 else 0)
        assert traffic.total == STEPS * per_step, f"{_label(p, config)}: {traffic.total} elements"


@pytest.mark.parametrize("name", ["1f1b", "zb_h1"])
def test_each_action_is_a_span_on_the_shared_clock_in_schedule_order(runs, name):
    """The measured Gantt chart under the plan needs one span per action, named as the action (``F3@s1``):
    F as forward, B as backward, W as weight, RECV as idle (waiting), SEND as comm, in the schedule's order.

    Planted bugs seen failing: receives recorded as comm, not as waiting (no idle spans on rank 1); W recorded
    as backward (``zb_h1``, rank 0)."""
    index = next(i for i, c in enumerate(CONFIGS[2]) if c.get("trace") and c["schedule"] == name)
    config = CONFIGS[2][index]
    schedule = make_schedule(config["schedule"], 2, config["micro_batches"])
    spans = runs[2][1][0][index]["spans"]
    kinds = {"F": "forward", "B": "backward", "W": "weight", "RECV_F": "idle", "RECV_B": "idle",
             "SEND_F": "comm", "SEND_B": "comm"}
    for rank in range(2):
        mine = [s for s in spans if s.rank == rank and s.kind in ("forward", "backward", "weight", "idle")
                or s.rank == rank and s.kind == "comm" and s.name.startswith("SEND")]
        expected = [(kinds[a.op], str(a)) for a in schedule.actions[rank]] * STEPS
        assert [(s.kind, s.name) for s in sorted(mine, key=lambda s: s.start)] == expected, f"rank {rank}"


# ----------------------------------------------------------------------------- schedules of one's own
def _gpipe_by_hand():
    """p = 2, m = 2, all forwards then all backwards, every message written out."""
    A = Action
    return Schedule("mine", 2, 2, 1, [
        [A("F", 0, 0), A("SEND_F", 0, 0), A("F", 0, 1), A("SEND_F", 0, 1),
         A("RECV_B", 0, 0), A("B", 0, 0), A("RECV_B", 0, 1), A("B", 0, 1)],
        [A("RECV_F", 1, 0), A("F", 1, 0), A("RECV_F", 1, 1), A("F", 1, 1),
         A("B", 1, 0), A("SEND_B", 1, 0), A("B", 1, 1), A("SEND_B", 1, 1)]])


def _mine(rank, world_size, schedule, config):
    try:
        return train(rank, world_size, "pipeline", schedule=schedule, **config)["records"]
    except (ScheduleError, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def test_a_schedule_written_by_hand_runs_and_a_bad_one_is_refused_before_anything_runs():
    """A bad schedule never deadlocks: one RECV left out is named (rank, action, reason) on every rank.

    Planted bug seen failing: a schedule passed in not validated (rank 1 dies of ``KeyError: (1, 1)`` at F1@s1,
    no reason given)."""
    config = dict(model="transformer", micro_batches=2, global_batch=6, steps=STEPS)
    good = _gpipe_by_hand()
    report = compare(train(0, 1, "single", **config)["records"], coursekit.launch(_mine, 2, good, config,
                                                                                   timeout=TIMEOUT))
    assert report.ok, str(report)
    bad = _gpipe_by_hand()
    bad.actions[1].remove(Action("RECV_F", 1, 1))
    messages = coursekit.launch(_mine, 2, bad, config, timeout=20)
    assert messages[0] == messages[1] and "rank 1, action F1@s1: F1@s1 needs its input, but RECV_F1@s1 is " \
                                          "missing on rank 1" in messages[0], messages


def _refused(rank, world_size):
    config = dict(model=mlp(8), data=TeacherData(), steps=1)
    return [_mine(rank, world_size, name, dict(config, micro_batches=m, stages_per_rank=v))
            for name, m, v in (("zb_h1", 2, 1), ("interleaved", 2, 2), ("gpipe", 1, 2))]


def test_schedules_a_generator_cannot_build_say_why():
    """m < p for ZB-H1 and interleaved, v > 1 for a one-stage-per-rank schedule: the generator's sentence.

    Planted bug seen failing: ``stages_per_rank`` not passed on to the generator (GPipe then ran, with v = 1)."""
    messages = coursekit.launch(_refused, 4, timeout=TIMEOUT)[0]
    assert "ZB-H1 needs m >= p" in messages[0], messages[0]
    assert "interleaved 1F1B needs m >= p" in messages[1], messages[1]
    assert "gpipe has one stage per rank: v must be 1" in messages[2], messages[2]
