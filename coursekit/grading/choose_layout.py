"""Checks of exercise 07 (``exercises/07_choose_a_layout.ipynb``): choose a layout for three training runs.

    from coursekit.grading import check_choose_layout
    check_choose_layout(choose_layout)

The learner writes ``choose_layout(scenario) -> Layout``: for each of :data:`SCENARIOS` (a model, its
sequence length and global batch, the GPUs and how many share a node) a
:class:`~coursekit.costmodel.Layout` -- the degrees ``dp × tp × pp × sp``, the ZeRO stage, the schedule and
its micro-batches, the recomputation. The scenarios are the three of issue 27's planner: GPT-3 Small (125 M)
on one node of 8 GPUs, GPT-3 13B on the same node, GPT-3 175B on 1,024 GPUs (128 nodes of 8). Three checks,
one case (one point) per scenario each:

* ``valid_layout``: the layout can run: its degrees multiply to the scenario's GPUs, tp divides the heads
  (and the padded vocabulary), pp the layers, ``dp × micro_batches`` the global batch, and a pipeline has
  ``m ≥ p`` micro-batches -- the rest as :func:`coursekit.costmodel.check_layout` refuses;
* ``fits_in_memory``: the most loaded GPU holds it (:func:`coursekit.costmodel.memory_per_gpu` ≤ the GPU's
  memory); the feedback names the largest term and what shrinks it ("optimizer state 154.3 GB per GPU: add
  ZeRO over dp ...");
* ``near_best_step_time``: its step time (:func:`coursekit.costmodel.step_time`) is within 10% of the
  planner's best (``plan(...)[0]``); the feedback names where the time goes that the best does not spend:
  the bubble at this m, a tp group crossing nodes, the exposed dp collectives, recomputation.

A case is judged only where the one before it passed (an invalid layout is not priced, a layout that does not
fit earns no time: it would not run). Every number comes from :func:`coursekit.costmodel.evaluate`, the same
one the planner ranks by, so the same attempt always gets the same score and feedback.

**Only what the learner chose.** The planner's search (``plan``, ``brute_force`` and ``layouts``, the space it
walks; :mod:`coursekit.answers`) is held back while ``choose_layout`` runs: a scenario whose layout comes from
it is not judged, and ``valid_layout`` says so. ``evaluate`` (one layout's memory, time and reasons),
``memory_per_gpu`` and ``step_time`` stay the learner's: they are the calculator the choice is made with. The
grader's own best is computed outside that block, once per scenario (:func:`best`). ``coursekit grade`` holds
the planner back from the notebook's first cell (:data:`coursekit.answers.WHOLE_NOTEBOOK`): a layout planned in
a cell and returned later stops the notebook there, with the same sentence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..answers import AnswerHeldBack, held_back, released
from ..costmodel import Candidate, Hardware, Layout, ModelConfig, check_layout, evaluate, plan
from .choose_layout_feedback import describe, memory_advice, slow_advice
from .registry import check
from .scoring import CheckFailed, NotDone, partial_credit

__all__ = ["EXERCISE", "Scenario", "SCENARIOS", "TOLERANCE", "best", "judge"]

EXERCISE = "07_choose_a_layout"
TOLERANCE = 0.10            # within 10% of the planner's best step time earns the point
VOCAB = 51_200              # GPT-2's 50,257 tokens padded as Megatron-LM does (to a multiple of 128 · tp = 1,024)
NOT_JUDGED = "not judged: {} (see valid_layout)"


@dataclass(frozen=True)
class Scenario:
    """One training run to lay out: ``global_batch`` sequences of ``config.seq_len`` tokens a step on ``gpus``."""

    key: str
    title: str
    config: ModelConfig
    hardware: Hardware
    gpus: int
    global_batch: int

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.hardware.gpus_per_node)


# Shapes from Brown et al. 2020, Table 2.1 (GPT-3 Small and 13B: their 5,140 is not 40 heads × 128; 5,120 is,
# as Megatron-LM and OPT-13B use); the 175B run is Narayanan et al. 2021's (Table 1: 1,024 A100s, batch 1,536).
SCENARIOS = {s.key: s for s in (
    Scenario("125m", "GPT-3 Small (125 M parameters) on one node of 8 GPUs",
             ModelConfig(VOCAB, 2048, 768, 12, 12, name="GPT-3 Small"), Hardware(), 8, 256),
    Scenario("13b", "GPT-3 13B on one node of 8 GPUs",
             ModelConfig(VOCAB, 2048, 5120, 40, 40, name="GPT-3 13B"), Hardware(), 8, 128),
    Scenario("175b", "GPT-3 175B on 1,024 GPUs (128 nodes of 8)",
             replace(ModelConfig.gpt3_175b(), vocab=VOCAB), Hardware(), 1024, 1536),
)}
INSTEAD = ("choose the degrees yourself from the numbers: evaluate(scenario.config, Layout(...), scenario.hardware, "
           "scenario.global_batch) prices one layout -- its memory, its step time and why")


@lru_cache(maxsize=None)
def best(scenario: Scenario) -> Candidate:
    """The planner's fastest layout that fits: the reference each choice's step time is held to (released: under
    ``coursekit grade`` the planner is held back from the notebook's first cell, see :data:`~coursekit.answers.WHOLE_NOTEBOOK`)."""
    with released(EXERCISE):
        return plan(scenario.config, scenario.hardware, scenario.gpus, scenario.global_batch, top=1)[0]


@dataclass(frozen=True)
class Judged:
    """One scenario's verdict: the learner's layout priced, or why it is not; ``held`` says the planner was called."""

    scenario: Scenario
    candidate: Candidate | None = None
    invalid: str | None = None
    held: bool = False


def _validity(scenario: Scenario, layout: Layout) -> str | None:
    """Why ``layout`` cannot run ``scenario``, the common mistakes in the exercise's words, or None."""
    c, n, B = scenario.config, scenario.gpus, scenario.global_batch
    if layout.gpus != n:
        return (f"dp × tp × pp × sp = {layout.dp} × {layout.tp} × {layout.pp} × {layout.sp} = {layout.gpus} GPUs, "
                f"but the scenario has {n}: every GPU takes one place in the mesh, so the degrees must multiply "
                f"to {n}")
    if c.heads % layout.tp:
        return f"tp = {layout.tp} does not divide the {c.heads} heads: each tensor-parallel rank takes whole heads"
    if c.layers % layout.pp:
        return f"pp = {layout.pp} does not divide the {c.layers} layers: every stage needs the same number"
    if layout.pp > 1 and layout.micro_batches < layout.pp:
        return (f"pp = {layout.pp} with micro_batches = {layout.micro_batches}: m < p, the pipeline never fills "
                f"(some stage has no micro-batch to work on; torchtitan hangs there): a pipeline needs m >= p, "
                f"micro_batches >= {layout.pp}")
    if B % (layout.dp * layout.micro_batches):
        return (f"the global batch of {B} does not split into dp = {layout.dp} replicas × {layout.micro_batches} "
                f"micro-batches: dp × micro_batches must divide {B}")
    try:
        check_layout(c, layout, B, n)
    except ValueError as refused:
        return str(refused)
    return None


def judge(scenario: Scenario, choose) -> Judged:
    """Call the learner's ``choose(scenario)`` with the planner held back, then price its layout (outside)."""
    try:
        with held_back(EXERCISE):   # the learner's call only: evaluate below and best() run as usual
            layout = choose(scenario)
    except NotImplementedError:
        return Judged(scenario, invalid="not done yet: choose_layout raises NotImplementedError for it")
    except AnswerHeldBack as refused:
        return Judged(scenario, invalid=str(refused), held=True)
    except Exception as error:  # the learner's code may fail in any way: this scenario lost, not the notebook
        return Judged(scenario, invalid=f"choose_layout raised {type(error).__name__}: {error}")
    if not isinstance(layout, Layout):
        return Judged(scenario, invalid=f"choose_layout returned {type(layout).__name__}, not a "
                                        f"coursekit.costmodel.Layout")
    problem = _validity(scenario, layout)
    if problem:
        return Judged(scenario, invalid=problem)
    return Judged(scenario, evaluate(scenario.config, layout, scenario.hardware, scenario.global_batch))


def _judged(submission, ctx) -> list[Judged]:
    """Every scenario judged once per grading; all of them unfinished is "not done"."""
    def compute():
        verdicts = [judge(s, submission.choose_layout) for s in SCENARIOS.values()]
        if all(v.invalid and v.invalid.startswith("not done yet") for v in verdicts):
            raise NotDone("not implemented yet (NotImplementedError)")
        return verdicts
    return ctx.memo((EXERCISE, "judged"), compute)


def _credit(outcomes: list[tuple[str, str | None]]) -> float:
    """``partial_credit`` over (scenario key, None or what is wrong); the same sentence for several scenarios is
    said once, after their keys ("125m, 13b and 175b: ...")."""
    try:
        return partial_credit([wrong for _, wrong in outcomes])
    except CheckFailed as failed:
        keys: dict[str, list[str]] = {}
        for key, wrong in outcomes:
            if wrong:
                keys.setdefault(wrong, []).append(key)
        lines = [f"{', '.join(k[:-1]) + ' and ' + k[-1] if len(k) > 1 else k[0]}: {wrong}" for wrong, k in keys.items()]
        raise CheckFailed("\n".join(lines), fraction=failed.fraction) from None


@check(EXERCISE, points=3)
def valid_layout(submission, ctx):
    """Each scenario's layout can run: degrees multiply to its GPUs and divide heads and layers, m >= p."""
    return _credit([(v.scenario.key, v.invalid) for v in _judged(submission, ctx)])


def _not_judged(v: Judged) -> str:
    why = "choose_layout calls coursekit's own planner here" if v.held else "not a valid layout"
    return NOT_JUDGED.format(why)


def _fits(v: Judged) -> str | None:
    if v.candidate is None:
        return _not_judged(v)
    if not v.candidate.fits:
        return f"{describe(v.candidate.layout)}: {memory_advice(v.candidate, v.scenario.hardware)}"
    return None


def _fast(v: Judged) -> str | None:
    if v.candidate is None:
        return _not_judged(v)
    if not v.candidate.fits:
        return "not judged: it does not fit (see fits_in_memory), so it never runs"
    reference = best(v.scenario)
    if v.candidate.seconds <= (1 + TOLERANCE) * reference.seconds:
        return None
    return f"{describe(v.candidate.layout)}: {slow_advice(v.candidate, reference, v.scenario)}"


@check(EXERCISE, points=3)
def fits_in_memory(submission, ctx):
    """Each valid layout fits: memory_per_gpu (parameters, gradients, optimizer state, activations) <= the GPU."""
    return _credit([(v.scenario.key, _fits(v)) for v in _judged(submission, ctx)])


@check(EXERCISE, points=3)
def near_best_step_time(submission, ctx):
    """Each layout that fits steps within 10% of the planner's best (plan(...)[0]); the feedback says where not."""
    return _credit([(v.scenario.key, _fast(v)) for v in _judged(submission, ctx)])
