"""``coursekit train --experts E --ep N`` (issue 45, item 6): a mixture of experts, its experts over ``ep`` ranks.

The trainer's curve equals one process's step for step (relative 1e-5, test_capstone's band): under ``torchrun``
(dp2 × ep2: one pair of ranks splitting 4 experts) and under ``coursekit.launch`` (``--dp 4 --ep 2``: ep borrows
from dp, so 4 ranks in two pairs, with the balance loss and the bias nudge on; and ``--ep 1``, the experts whole on
every rank). The reference, :func:`~coursekit.capstone.one_process_losses`, is chapter 02's one-process loop on the
same model and data (with the balance loss: the batch in the ranks' slices, as each rank's balance loss is its own
tokens'). Equal curves would not show the experts spread (``ep = 1`` trains the same curve), so each run's log
says how many experts each rank held and the ``ep`` groups. Whatever cannot run is refused before any rank starts,
with why and what works instead (exit status 2).

Planted bugs, seen failing (each undone):
* the experts' gradients summed over the world instead of dp (``"expert"``'s synchronize) -> the torchrun test
  "step 1: 2.7688785791397095 against one process's 2.766089916229248", and dp4 × ep2 alike (dp2 × ep1 passes: there
  dp is the world);
* ``ep`` not handed to the strategy (its mesh dp × ep1) -> "each rank should hold E / ep = 2 experts a layer:
  [4, 4]" under torchrun, "[4, 4, 4, 4]" under launch -- the curve alone would have passed;
* ``--aux-weight`` not handed to the strategy -> "step 0: 2.800656318664551 against one process's 2.845012068748474";
* ``--bias-rate`` not handed to the strategy -> "step 1: 2.8148796558380127 against one process's 2.814628541469574";
* the precision refusal dropped -> ``--precision bf16 --experts 4`` trained in fp32 and exited 0: "assert 0 == 2".
"""

from __future__ import annotations

import json

import pytest

from coursekit.capstone import Config, check, one_process_losses
from coursekit.capstone.__main__ import main

from test_capstone import COMMON, STEPS, torchrun


def _same_curve(losses: list[float], reference: list[float]) -> None:
    assert len(losses) == len(reference)
    for step, (got, want) in enumerate(zip(losses, reference)):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {step}: {got!r} against one process's {want!r}"


def _reference(**moe) -> list[float]:
    return one_process_losses(Config(batch=8, steps=STEPS, **moe))


def _spread(log: dict, world: int, ep: int, experts: int) -> None:
    assert log["experts_here"] == [experts // ep] * world, \
        f"each rank should hold E / ep = {experts // ep} experts a layer: {log['experts_here']}"
    assert log["ep_groups"] == [list(range(g, g + ep)) for g in range(0, world, ep)], log["ep_groups"]


def test_dp2_ep2_under_torchrun_equals_one_process(tmp_path):
    """``torchrun --nproc-per-node 2 -m coursekit.capstone --dp 2 --ep 2 --experts 4``: 2 ranks, 2 experts each."""
    log = torchrun(2, ["--dp", "2", "--ep", "2", "--experts", "4"], tmp_path / "log.json")
    assert log["layout"] == "dp2×ep2 E4 k2", log["layout"]
    _spread(log, 2, 2, 4)
    _same_curve(log["losses"], _reference(dp=2, ep=2, experts=4))


LAUNCHED = {
    "dp4xep2-k1-balanced": (["--dp", "4", "--ep", "2", "--experts", "4", "--top-k", "1", "--aux-weight", "0.01",
                             "--bias-rate", "0.01"],
                            dict(dp=4, ep=2, experts=4, top_k=1, aux_weight=0.01, bias_rate=0.01), "dp4×ep2 E4 k1"),
    "dp2-ep1": (["--dp", "2", "--experts", "4"], dict(dp=2, experts=4), "dp2 E4 k2"),
}


@pytest.mark.parametrize("name", LAUNCHED)
def test_launched_by_the_trainer_equals_one_process(tmp_path, name):
    """``coursekit train`` with no torchrun around it (coursekit.launch starts the ranks): ``--dp 4 --ep 2`` is 4
    ranks in two pairs (the strategy's mesh dp2 × ep2), the Switch balance loss and DeepSeek-V3's bias nudge on;
    ``--ep 1`` is the "expert" strategy with every expert on every rank."""
    args, moe, layout = LAUNCHED[name]
    log = tmp_path / "log.json"
    assert main([*args, *COMMON, "--log-json", str(log)]) == 0
    summary = json.loads(log.read_text())
    assert summary["layout"] == layout, summary["layout"]
    _spread(summary, moe["dp"], moe.get("ep", 1), moe["experts"])
    _same_curve(summary["losses"], _reference(**moe))


E4 = ["--experts", "4"]
REFUSED = {
    "ep without experts": (["--dp", "2", "--ep", "2"],
                           "ep = 2 spreads the experts of a mixture of experts, but experts = 0 trains the dense "
                           "transformer: give experts, a multiple of ep, e.g. experts = 4.",
                           "--ep, --experts"),
    "ep alone": (["--ep", "2"], "ep = 2 spreads the experts of a mixture of experts, but experts = 0 trains the dense "
                 "transformer: give experts, a multiple of ep, e.g. experts = 4 and dp = 2.", "--dp, --ep, --experts"),
    "ep not dividing dp": (["--dp", "3", "--ep", "2", *E4],
                           "ep = 2 does not divide dp = 3: expert parallelism borrows its ranks from dp (groups of ep "
                           "data-parallel ranks split the experts); use an ep that divides dp, e.g. ep = 1, or dp = 4.",
                           "--dp, --ep"),
    "ep not dividing experts": (["--dp", "4", "--ep", "4", "--experts", "6"],
                                "ep = 4 does not divide experts = 6: each of the ep ranks holds experts / ep whole "
                                "experts; use an ep that divides experts, e.g. ep = 2, or experts = 8.",
                                "--ep, --experts"),
    "tp": (["--dp", "2", "--tp", "2", "--ep", "2", *E4],
           "experts = 4 with pp = 1, sp = 1, tp = 2: this trainer runs a mixture of experts on data and expert "
           "parallelism only (chapter 07's 'expert' strategy keeps whole blocks on every rank); use pp = sp = tp = 1, "
           "e.g. tp = 1.", "--pp, --sp, --tp, --experts"),
    "zero": (["--dp", "2", "--ep", "2", "--zero", "1", *E4],
             "zero = 1 with experts = 4: ZeRO shards one dense model's state over dp, and the 'expert' strategy keeps "
             "each rank's experts and its copy of the rest whole, with their Adam state; use zero = 0.",
             "--zero, --experts"),
    "precision": (["--dp", "2", "--ep", "2", "--precision", "bf16", *E4],
                  "precision = 'bf16' with experts = 4: the 'expert' strategy computes in fp32 (16-bit compute is the "
                  "composed strategy's, on the dense transformer); use precision = 'fp32'.",
                  "--precision, --experts"),
    "microbatches": (["--dp", "2", "--ep", "2", "--microbatches", "2", *E4],
                     "micro_batches = 2 with experts = 4: the 'expert' strategy nudges its routers by the tokens of a "
                     "rank's last forward, so it routes each rank's slice in one; use micro_batches = 1.",
                     "--microbatches, --experts"),
    "checkpoints": (["--dp", "2", "--ep", "2", "--checkpoint-dir", "ckpt", *E4],
                    "checkpoint_dir with experts = 4: the trainer's checkpoints describe the composed strategy's "
                    "shards (tp's, pp's stages), not experts spread over ep; train without checkpoint_dir.",
                    "--checkpoint-dir, --experts"),
    "top_k": (["--top-k", "5", *E4],
              "top_k = 5 with experts = 4: each token picks top_k of the experts; use a top_k of at most 4, "
              "e.g. top_k = 4.", "--experts, --top-k"),
    "aux without experts": (["--aux-weight", "0.01"],
                            "aux_weight = 0.01 balances the load of experts, but experts = 0 trains the dense "
                            "transformer: give experts, or leave aux_weight out, e.g. experts = 4, or aux_weight = 0.0.",
                            "--experts, --aux-weight"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_cannot_run_is_refused_with_why(capsys, name):
    """Each refusal is one sentence -- what is wrong, why, what works instead (a change checked to pass) -- and the
    command line's flags for the settings it names; exit status 2, nothing launched, no traceback."""
    args, sentence, flags = REFUSED[name]
    assert main([*args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"coursekit train: {sentence} (command line: {flags})\n", err


def test_under_torchrun_the_refusal_fits_the_jobs_ranks():
    """Under torchrun the ranks are given: ``--ep 2`` without experts on 2 ranks names a change for those 2 (the
    same check every rank runs before it joins: ``coursekit.capstone.__main__._torchrun``)."""
    with pytest.raises(ValueError) as caught:
        check(Config(dp=2, ep=2), world_size=2)
    assert str(caught.value).endswith("give experts, a multiple of ep, e.g. experts = 4."), caught.value
    assert caught.value.suggestion == {"experts": 4}
    check(Config(dp=4, ep=2, experts=4), world_size=4)  # ep borrows from dp: 4 ranks, not 8


def test_help_names_the_flags(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--experts", "--ep", "--top-k", "--aux-weight", "--bias-rate"):
        assert flag in out, flag
    assert "ep borrows from dp and adds no ranks: --dp 4 --ep 2 is 4 ranks" in out, out
