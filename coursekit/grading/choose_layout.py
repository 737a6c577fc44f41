"""Checks of exercise 08 (``exercises/08_choose_a_layout.ipynb``): choose a layout for three training runs.

    from coursekit.grading import check_choose_layout
    check_choose_layout(choose_layout)

The learner writes ``choose_layout(scenario) -> Layout`` for *any* training run (a model, its sequence length
and global batch, the GPUs and how many share a node): the degrees ``dp × tp × pp × sp``, the ZeRO stage, the
schedule and its micro-batches, the recomputation. :data:`SCENARIOS` are the three the notebook shows (GPT-3 Small
and 13B on one node of 8 GPUs, GPT-3 175B on 1,024); :data:`HIDDEN` three more of the same kinds at other sizes,
which only the grader runs -- so a layout copied from chapter 08, or a function that knows only the three keys,
earns nothing there. Checks (one point per scenario):

* ``valid_layout``: the layout can run: its degrees multiply to the scenario's GPUs, tp divides the heads
  (and the padded vocabulary), pp the layers, ``dp × micro_batches`` the global batch, and a pipeline has
  ``m ≥ p`` micro-batches -- the rest as :func:`coursekit.costmodel.check_layout` refuses;
* ``fits_in_memory``: the most loaded GPU holds it (:func:`coursekit.costmodel.memory_per_gpu` ≤ the GPU's
  memory); the feedback names the largest term and what shrinks it ("optimizer state 154.3 GB per GPU: add
  ZeRO over dp ...");
* ``follows_the_chapter``: the reasoning chapter 08 teaches, not a ranking its time model cannot make (one run's
  speed is off by up to 1.38× against published runs, a ratio of two layouts by 1.09×: :mod:`coursekit.costmodel.ties`): a model whose states fit one GPU runs on
  data parallelism alone (P1, P10); tp stays inside a node; a pipeline only where every layout without one is
  more than :data:`PIPELINE_PAYS` slower than the planner's best (P10), and then with a bubble under
  :data:`MAX_BUBBLE` of the step (P7); and the step within :data:`BAND` × the planner's best (``plan(...)[0]``);
* ``hidden_scenarios`` (hidden): the three checks above on :data:`HIDDEN`, the first failure of each said.

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
from ..costmodel import (Candidate, Hardware, Layout, ModelConfig, check_layout, evaluate, layouts, model_state_bytes,
                         num_params, plan)
from .choose_layout_feedback import describe, memory_advice, slow_advice, tp_advice
from .registry import check
from .scoring import CheckFailed, NotDone, partial_credit

__all__ = ["EXERCISE", "Scenario", "SCENARIOS", "HIDDEN", "BAND", "PIPELINE_PAYS", "MAX_BUBBLE", "best",
           "best_without_pipeline", "judge"]

EXERCISE = "08_choose_a_layout"
# The checks that judge the answer; the others judge its properties and earn nothing while it is wrong.
ANSWER = ("valid_layout", "fits_in_memory", "follows_the_chapter")
BAND = 1.5                  # the step within 1.5x the planner's best: wider than the model's error (costmodel.ties)
PIPELINE_PAYS = 0.10        # a pipeline only where every layout without one is more than 10% slower than the best
MAX_BUBBLE = 0.20           # a pipeline's bubble under a fifth of the step
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
             ModelConfig(VOCAB, 2048, 768, 12, 12, name="GPT-3 Small"), Hardware.a100(), 8, 256),
    Scenario("13b", "GPT-3 13B on one node of 8 GPUs",
             ModelConfig(VOCAB, 2048, 5120, 40, 40, name="GPT-3 13B"), Hardware.a100(), 8, 128),
    Scenario("175b", "GPT-3 175B on 1,024 GPUs (128 nodes of 8)",
             replace(ModelConfig.gpt3_175b(), vocab=VOCAB), Hardware.a100(), 1024, 1536),
)}
# The same three kinds at other sizes, run only by the grader: a model that fits one GPU (GPT-3 Medium, Brown et al.
# 2020, Table 2.1) on two nodes; one that does not (GPT-3 6.7B) on one node of 40 GB GPUs; GPT-3 175B on half the
# GPUs and a third of the batch, where a pipeline still pays.
HIDDEN = {s.key: s for s in (
    Scenario("350m", "GPT-3 Medium (350 M parameters) on 16 GPUs (2 nodes of 8)",
             ModelConfig(VOCAB, 2048, 1024, 24, 16, name="GPT-3 Medium"), Hardware.a100(), 16, 512),
    Scenario("6.7b", "GPT-3 6.7B on one node of 8 GPUs of 40 GB",
             ModelConfig(VOCAB, 2048, 4096, 32, 32, name="GPT-3 6.7B"), replace(Hardware.a100(), memory=40e9), 8, 64),
    Scenario("175b-512", "GPT-3 175B on 512 GPUs (64 nodes of 8), batch 512",
             replace(ModelConfig.gpt3_175b(), vocab=VOCAB), Hardware.a100(), 512, 512),
)}
INSTEAD = ("choose the degrees yourself from the numbers: evaluate(scenario.config, Layout(...), scenario.hardware, "
           "scenario.global_batch) prices one layout -- its memory, its step time and why")


@lru_cache(maxsize=None)
def best(scenario: Scenario) -> Candidate:
    """The planner's fastest layout that fits: the reference each choice's step time is held to (released: under
    ``coursekit grade`` the planner is held back from the notebook's first cell, see :data:`~coursekit.answers.WHOLE_NOTEBOOK`)."""
    with released(EXERCISE):
        return plan(scenario.config, scenario.hardware, scenario.gpus, scenario.global_batch, top=1)[0]


@lru_cache(maxsize=None)
def best_without_pipeline(scenario: Scenario) -> Candidate | None:
    """The fastest layout with pp = 1 that fits, from the planner's whole space (None: none fits)."""
    with released(EXERCISE):
        fitting = (c for c in (evaluate(scenario.config, layout, scenario.hardware, scenario.global_batch)
                               for layout in layouts(scenario.config, scenario.hardware, scenario.gpus,
                                                     scenario.global_batch) if layout.pp == 1) if c.fits)
        return min(fitting, key=lambda c: c.seconds, default=None)


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


def _judged(submission, ctx, scenarios: dict = SCENARIOS) -> list[Judged]:
    """Every scenario judged once per grading; all of them unfinished is "not done"."""
    def compute():
        verdicts = [judge(s, submission.choose_layout) for s in scenarios.values()]
        if all(v.invalid and v.invalid.startswith("not done yet") for v in verdicts):
            raise NotDone("not implemented yet (NotImplementedError)")
        return verdicts
    return ctx.memo((EXERCISE, "judged", tuple(scenarios)), compute)


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


def _lesson(v: Judged) -> str | None:
    """The first of chapter 08's rules the layout breaks (fits one GPU -> dp alone; tp inside a node; a pipeline
    only where it pays, with a small bubble; the step within BAND of the best), or None."""
    if v.candidate is None:
        return _not_judged(v)
    if not v.candidate.fits:
        return "not judged: it does not fit (see fits_in_memory), so it never runs"
    c, scenario = v.candidate, v.scenario
    layout, hardware, mine = c.layout, scenario.hardware, describe(c.layout)
    states = model_state_bytes(num_params(scenario.config).total).total
    if states <= hardware.memory and (layout.tp, layout.pp, layout.sp) != (1, 1, 1):
        return (f"{mine}: the model's states, {states / 1e9:.1f} GB with Adam, fit one GPU of "
                f"{hardware.memory / 1e9:.0f} GB: data parallelism alone (P1, P10; tp = pp = sp = 1), with "
                f"micro-batches for the activations. tp, pp or sp only add communication or a bubble here")
    if layout.tp > hardware.gpus_per_node:
        return f"{mine}: {tp_advice(c, scenario)}"
    reference = best(scenario)
    if layout.pp > 1:
        flat = best_without_pipeline(scenario)
        if flat is not None and flat.seconds <= (1 + PIPELINE_PAYS) * reference.seconds:
            return (f"{mine}: a pipeline does not pay here (P10): without one, {describe(flat.layout)} fits and "
                    f"steps in {flat.seconds:.3g} s, within {PIPELINE_PAYS:.0%} of the best, {reference.seconds:.3g} s "
                    f"-- closer than the time model can tell apart. Keep pp = 1: tp inside the node and dp (or ZeRO) "
                    f"across")
        if c.time.bubble > MAX_BUBBLE * c.seconds:
            return f"{mine}: {slow_advice(c, reference, scenario, band=BAND, only='bubble')}"
    if c.seconds > BAND * reference.seconds:
        return f"{mine}: {slow_advice(c, reference, scenario, band=BAND)}"
    return None


def _first_problem(v: Judged) -> str | None:
    """A hidden scenario's verdict: its first failure among the three checks, named with the scenario."""
    problem = (v.invalid if v.candidate is None else None) or _fits(v) or _lesson(v)
    return problem and f"{v.scenario.title}: {problem}"


@check(EXERCISE, points=3)
def fits_in_memory(submission, ctx):
    """Each valid layout fits: memory_per_gpu (parameters, gradients, optimizer state, activations) <= the GPU."""
    return _credit([(v.scenario.key, _fits(v)) for v in _judged(submission, ctx)])


@check(EXERCISE, points=3)
def follows_the_chapter(submission, ctx):
    """Each layout that fits follows chapter 08: dp alone if the model fits one GPU, tp inside a node, a pipeline
    only where it pays and with a small bubble, the step within 1.5x the planner's best."""
    return _credit([(v.scenario.key, _lesson(v)) for v in _judged(submission, ctx)])


@check(EXERCISE, points=3, hidden=True, requires=ANSWER)
def hidden_scenarios(submission, ctx):
    """Three runs the notebook does not show (GPT-3 Medium on 16 GPUs, 6.7B on 8 GPUs of 40 GB, 175B on 512): each
    valid, fitting and following the chapter."""
    return _credit([(v.scenario.key, _first_problem(v)) for v in _judged(submission, ctx, HIDDEN)])
