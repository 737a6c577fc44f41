"""A refused layout names its own reason, and every change its sentence suggests passes the same check.

Chapter 10 shows these sentences to learners, so each is held to two things: the words of its own reason (not
the world size's, when the layout has a reason of its own), and each "e.g." -- read back from the sentence, and
from the error's ``suggestion`` -- applied to the config and checked again on the same ranks.

Planted, seen failing:
* the world-size product checked first (as it was) -> pp2 zero3, tp3 and pp2 interleaved m=1 on 4 ranks say
  "multiply to 2 / 3, but the job has 4 ranks", not their own reason;
* suggestions not run through the check (the first candidate taken as it is) -> sp = 1 for tp2 × sp2 on 8
  ranks with a batch of 2, which leaves dp = 4 and a slice of 0 samples, refused in turn;
* the old advice for pp2 zero3, "dp = 2 with the others as given", as its only fix -> checked, it fits
  nothing, so the suggestion is None and the sentence has no "e.g."; taken unchecked, the sentence says
  "e.g. dp = 2", and check refuses pp2 × dp2 zero3 in turn.
* ``check`` not telling :func:`~coursekit.parallel.hybrid.refuse` the run's ``checkpoint_dir`` (as it was when
  ``--experts`` came) -> dp2 × ep2 with checkpoints: "no suggestion for: checkpoint_dir with experts = 4: ..." (the
  fix "checkpoint_dir = None" looked like no change).
"""

from __future__ import annotations

import ast
from dataclasses import replace

import pytest

from coursekit.capstone import Config, check
from coursekit.capstone.__main__ import main
from coursekit.capstone.run import FIELDS
from coursekit.parallel.hybrid import LayoutError, check_degrees, mesh_shape

REFUSED = [  # (config, ranks, words only its own reason says)
    # chapter 10's six, on 4 ranks
    (Config(dp=3, tp=2), 4, "multiply to 6, but the job has 4 ranks"),
    (Config(tp=2, sp=2), 4, "ring attention over tensor-parallel heads"),
    (Config(pp=4, layers=1), 4, "the model has 3 layers to cut"),
    (Config(tp=3), 4, "does not divide the model's 4 attention heads"),
    (Config(pp=2, zero=3), 4, "runs on pure data parallelism"),
    (Config(pp=2, microbatches=1, schedule="interleaved", stages_per_rank=2), 4, "at least pp = 2 micro-batches"),
    # other rank counts and reasons
    (Config(tp=4), 2, "multiply to 4, but the job has 2 ranks"),
    (Config(dp=2), 3, "multiply to 2, but the job has 3 ranks"),
    (Config(tp=2, sp=2), 8, "ring attention over tensor-parallel heads"),
    (Config(tp=2, sp=2, batch=2), 8, "ring attention over tensor-parallel heads"),
    (Config(dp=2, tp=2, zero=2), 8, "runs on pure data parallelism"),
    (Config(pp=8, layers=2), 8, "the model has 4 layers to cut"),
    (Config(pp=2, layers=1, schedule="interleaved", stages_per_rank=2, microbatches=2), 4, "needs 4 stages"),
    (Config(tp=3, heads=6, d_model=96), 3, "does not divide the vocabulary of 16"),
    (Config(sp=4, seq_len=8), 4, "only 7 tokens"),
    (Config(pp=3, microbatches=2, schedule="zb_h1"), 3, "to fill the bubble"),
    (Config(pp=4, layers=8, microbatches=9, schedule="interleaved", stages_per_rank=2), 8, "does not split into 2"),
    (Config(tp=2, stages_per_rank=2), 2, "needs schedule = 'interleaved'"),
    (Config(dp=4, microbatches=8), 4, "fewer than micro_batches = 8"),
    (Config(d_model=66), 1, "is not a multiple of heads = 4"),
    (Config(steps=0), 1, "train at least one step"),
    (Config(dp=2, zero=1, checkpoint_dir="/tmp/unused"), 2, "does not checkpoint"),
    (Config(zero=5), 1, "use 0 (none), 1, 2 or 3"),
    (Config(schedule="1f2b"), 1, "use one of"),
    # a mixture of experts (tests/test_capstone_expert.py has each sentence whole, from the command line)
    (Config(dp=2, ep=2), 2, "experts = 0 trains the dense transformer"),
    (Config(aux_weight=0.01), 1, "balances the load of experts"),
    (Config(dp=3, ep=2, experts=4), 3, "expert parallelism borrows its ranks from dp"),
    (Config(dp=4, ep=4, experts=6), 4, "holds experts / ep whole experts"),
    (Config(dp=2, tp=2, ep=2, experts=4), 4, "on data and expert parallelism only"),
    (Config(dp=2, ep=2, experts=4, zero=1), 2, "ZeRO shards one dense model's state"),
    (Config(dp=2, ep=2, experts=4, precision="bf16"), 2, "computes in fp32"),
    (Config(dp=2, ep=2, experts=4, microbatches=2), 2, "routes each rank's slice in one"),
    (Config(dp=2, ep=2, experts=4, checkpoint_dir="/tmp/unused"), 2, "not experts spread over ep"),
    (Config(experts=4, top_k=5), 1, "use a top_k of at most 4"),
]
IDS = [f"{c.layout}-{w}-{i}" for i, (c, w, _) in enumerate(REFUSED)]


def refusal(config: Config, world_size: int | None) -> LayoutError:
    with pytest.raises(LayoutError) as refused:
        check(config, world_size)
    return refused.value


def examples(message: str) -> list[dict]:
    """The changes after "e.g." in ``message`` (``tp = 2 and dp = 2, or tp = 4``), as Config fields."""
    if ", e.g. " not in message:
        return []
    text = message.rsplit(", e.g. ", 1)[1].removesuffix(".")
    changes = []
    for alternative in text.split(", or "):
        pairs = (setting.split(" = ") for setting in alternative.split(" and "))
        changes.append({FIELDS.get(name, name): ast.literal_eval(value) for name, value in pairs})
    return changes


@pytest.mark.parametrize("config, world_size, words", REFUSED, ids=IDS)
def test_a_refused_layout_names_its_own_reason(config, world_size, words):
    message = str(refusal(config, world_size))
    assert words in message, message
    if config.world_size != world_size and "but the job has" not in words:
        # its own reason, and the world size only as something to mend along with it
        assert "but the job has" not in message and f"the job's {world_size} ranks" in message, message


@pytest.mark.parametrize("config, world_size, words", REFUSED, ids=IDS)
def test_every_suggested_change_passes_on_the_same_ranks(config, world_size, words):
    error = refusal(config, world_size)
    assert error.suggestion, f"no suggestion for: {error}"
    for change in [error.suggestion, *examples(str(error))]:
        check(replace(config, **change), world_size)   # raises (the test fails) if the suggestion is refused


def test_the_sentence_shows_the_suggestion_first():
    error = refusal(Config(pp=2, zero=3), 4)
    assert examples(str(error)) == [{"zero": 1, "dp": 2}, {"pp": 1, "dp": 4}], str(error)
    assert error.suggestion == {"zero": 1, "dp": 2}
    error = refusal(Config(tp=3), 4)
    assert examples(str(error)) == [{"tp": 4}, {"tp": 2, "dp": 2}], str(error)


@pytest.mark.parametrize("config", [Config(tp=3), Config(pp=2, zero=3), Config(tp=2, sp=2), Config(pp=4, layers=1),
                                    Config(pp=2, stages_per_rank=2, schedule="interleaved")],
                         ids=lambda c: c.layout)
def test_without_a_world_size_a_suggestion_may_change_the_ranks(config):
    """The command line starts as many ranks as the degrees make: ``tp = 4`` for tp3, not tp = 1 with dp = 3."""
    error = refusal(config, None)
    for change in [error.suggestion, *examples(str(error))]:
        check(replace(config, **change))


def test_check_degrees_suggests_in_its_own_names():
    sizes = dict(n_heads=4, n_layers=2, vocab_size=16, seq_len=31, global_batch=8, micro_batches=1)
    with pytest.raises(LayoutError) as refused:
        check_degrees(mesh_shape(pp=2), 4, **sizes, schedule="interleaved", stages_per_rank=2)
    change = refused.value.suggestion
    assert "micro_batches" in change, change
    shape = mesh_shape(**{axis: change.get(axis, 1 if axis != "pp" else 2) for axis in ("pp", "dp", "sp", "tp")})
    rest = {k: v for k, v in change.items() if k not in shape}
    check_degrees(shape, 4, **{**sizes, **rest}, schedule="interleaved", stages_per_rank=2)


def test_a_layout_with_nothing_to_suggest_says_so_plainly():
    error = refusal(Config(resume=True), None)
    assert error.suggestion is None and "e.g." not in str(error)


def test_the_command_line_adds_its_flags_to_the_suggestion(capsys):
    assert main(["--pp", "2", "--zero", "3"]) == 2
    err = capsys.readouterr().err
    assert "e.g. zero = 1, or pp = 1 and dp = 2." in err and err.rstrip().endswith("--zero)"), err
