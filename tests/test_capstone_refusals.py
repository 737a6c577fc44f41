"""Every failure of ``coursekit train`` is one sentence, exit status 2, no traceback, on every rank (issue 60).

The sentence names the problem and what to change, in the library's words (``lr = nan``), and the command line adds
the flag (``(command line: --lr)``). A flag out of its range is refused by :func:`coursekit.capstone.check` before any
rank starts: on its own the command line launches nothing, and under ``torchrun`` each rank refuses before
``init_process_group``. Both are driven here in-process, with the launch and the process group replaced by a
failure ("ranks were launched"), so a missing check fails fast instead of training. A loss that diverges stops
every rank after the same step; that takes real ranks: two under ``coursekit.launch`` per case, one ``torchrun``.

Planted bugs, seen failing (each undone; the first message of ``pytest -x``):

* the lr check removed -> "Failed: ranks were launched for Config(dp=2, ..., lr=nan, ...)" (the table, --lr nan);
* the ``--log-json`` folder check removed -> "Failed: ranks were launched for Config(..., log='/tmp/.../logs', ...)";
* ``timeout`` left out of ``FLAGS`` -> "('--timeout' not in the command line's flags) coursekit train: timeout = 0.0:
  use a number of seconds above 0 ...";
* the divergence stop removed -> "the run should stop (exit 2), not exit 0" (both launch cases) and "torchrun
  exited 0";
* the stop on rank 0 only (``if sentence and dist.get_rank() == 0``) -> under launch "LaunchTimeout: ranks [1] still
  running after 30 s (a recv with no matching send, or a collective not every rank called?)" (rank 1 went on into
  step 3's all-reduce); under torchrun "a rank's traceback" (rank 1's, through coursekit/);
* the bound at ln(vocab) + 100 instead of + 25 -> pp2 lr 1 trained all 4 steps: "the run should stop (exit 2), not
  exit 0"; at 10 × ln(vocab) (the first bound tried) -> "AssertionError: (2, [0.75..., 0.30..., 9.56..., 0.25...])":
  a spike that comes back (2 tokens, lr 0.1) taken for a divergence;
* ``with_flags`` not applied to a refused run's sentence -> "('--lr' not in the command line's flags) coursekit train:
  the loss diverged at step 3 of 4: 63.45, above 27.73 ..." (launch), "assert ....endswith('(command line: --lr)')"
  (torchrun);
* ZeRO's ``compute_dtype`` left out of its counters -> "the log says compute_dtype None";
* ``--resume --overwrite`` left to the checkpoint directory's check (as it was: after launch) -> "Failed: ranks were
  launched for Config(..., resume=True, overwrite=True, ...)".

Found, not planted: under torchrun (``python -u``) print() writes a line's text and its newline apart, so two
ranks saying their sentence at once can share a line; seen once here beside busy loops (load 17: "rank 1 did not
say the sentence", its exit status 2), the two writes confirmed with strace; each rank now writes its line whole.
Not reproduced at will (3 runs with print() back passed).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch.distributed as dist

import coursekit
from coursekit.capstone import Config, check, one_process_losses
from coursekit.capstone.run import diverged
from coursekit.capstone import __main__ as capstone_main
from coursekit.capstone.__main__ import main

from test_capstone import TORCHRUN, _finish, _job

QUICK = ["--steps", "4", "--batch", "8", "--quiet"]


def _refused(flags: list[str], tmp: Path) -> list[str]:
    """``flags`` with ``{tmp}`` filled in: a folder, and a file whose name is used as a folder."""
    (tmp / "logs").mkdir(exist_ok=True)
    (tmp / "a-file").write_text("not a folder\n")
    return [flag.format(tmp=tmp) for flag in flags]


# (flags, the flag the sentence must name, words of its own reason). Each case on --dp 2 (2 ranks: what torchrun
# starts below), so that only the flag under test is out of its range.
TABLE = [
    (["--lr", "nan"], "--lr", "lr = nan: use a finite learning rate above 0"),
    (["--lr", "inf"], "--lr", "lr = inf: use a finite learning rate above 0"),
    (["--lr", "-1"], "--lr", "lr = -1.0: use a finite learning rate above 0"),
    (["--lr", "0"], "--lr", "lr = 0.0: use a finite learning rate above 0"),
    (["--heads", "0"], "--heads", "heads = 0: each block needs at least one attention head"),
    (["--heads", "3"], "--heads", "d_model = 64 is not a multiple of heads = 3"),
    (["--d-model", "0"], "--d-model", "d_model = 0: each head needs at least one feature"),
    (["--d-model", "256"], "--d-model", "d_model = 256: the course transformer is small on purpose"),
    (["--seq-len", "0"], "--seq-len", "seq_len = 0: the synthetic language draws each token from the two before"),
    (["--seq-len", "1"], "--seq-len", "seq_len = 1:"),
    (["--seq-len", "2"], "--seq-len", "seq_len = 2:"),
    (["--layers", "0"], "--layers", "layers = 0: the transformer needs at least one block"),
    (["--vocab", "0"], "--vocab", "vocab = 0: the synthetic language needs at least 2 tokens"),
    (["--vocab", "1"], "--vocab", "vocab = 1:"),
    (["--batch", "0"], "--batch", "global_batch = 0: each step needs a sequence at least"),
    (["--batch", "-1"], "--batch", "global_batch = -1:"),
    (["--microbatches", "0"], "--microbatches", "micro_batches = 0: use a whole number >= 1"),
    (["--steps", "0"], "--steps", "steps = 0: train at least one step"),
    (["--seed", str(10**13)], "--seed", f"seed = {10**13}: use a whole number from -10**12 to 10**12"),
    (["--timeout", "0"], "--timeout", "timeout = 0.0: use a number of seconds above 0 and at most 1e9"),
    (["--timeout", "-1"], "--timeout", "timeout = -1.0:"),
    (["--timeout", "inf"], "--timeout", "timeout = inf:"),
    (["--timeout", "nan"], "--timeout", "timeout = nan:"),
    (["--timeout", "1e10"], "--timeout", "timeout = 10000000000.0:"),
    (["--experts", "4", "--aux-weight", "nan"], "--aux-weight", "aux_weight = nan: use a finite number >= 0"),
    (["--experts", "4", "--aux-weight", "-1"], "--aux-weight", "aux_weight = -1.0:"),
    (["--experts", "4", "--bias-rate", "inf"], "--bias-rate", "bias_rate = inf: use a finite number >= 0"),
    (["--aux-weight", "nan"], "--aux-weight", "aux_weight = nan:"),   # without experts: the number first
    (["--experts", "-1"], "--experts", "experts = -1: use a whole number >= 0"),
    (["--experts", "4", "--top-k", "0"], "--top-k", "top_k = 0: use a whole number >= 1"),
    (["--experts", "4", "--top-k", "5"], "--top-k", "use a top_k of at most 4"),
    (["--checkpoint-dir", "{tmp}/ckpt", "--resume", "--overwrite"], "--overwrite",
     "resume = True with overwrite = True: resume goes on from the checkpoints, overwrite starts at step 0"),
    (["--log-json", "{tmp}/logs"], "--log-json", "is a folder: name a file to write the loss curve to"),
    (["--log-json", "{tmp}/a-file/log.json"], "--log-json", "is a file, not a folder"),
    (["--log-json", "/proc/coursekit/log.json"], "--log-json", "cannot be written: no file can be made in '/proc'"),
]


@pytest.fixture
def nothing_starts(monkeypatch):
    """No rank may start: the launch and the process group fail the test instead (fast, where a check is missing)."""
    def launched(fn, world_size, config, **kwargs):
        pytest.fail(f"ranks were launched for {config}")

    def joined(*args, **kwargs):
        pytest.fail("a torchrun rank reached init_process_group")

    monkeypatch.setattr(coursekit, "launch", launched)
    monkeypatch.setattr(dist, "init_process_group", joined)


def _as_torchrun_rank(monkeypatch) -> None:
    """This process as rank 0 of a torchrun job of 2 (the environment ``in_torchrun`` reads; nothing listens).

    A rank's Ctrl-C handling is left out: it blocks SIGINT and SIGTERM for the whole process and starts a thread
    that waits for them and ends the process, which in pytest's would outlive the test."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setattr(capstone_main, "_leave_on_signal", lambda *args, **kwargs: None)


def _one_sentence(err: str, flag: str, words: str) -> str:
    """The one line of ``err``: a sentence with ``words``, ending with the command line's flags, ``flag`` among them."""
    assert "Traceback" not in err and 'File "' not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{err}"
    assert words in lines[0], lines[0]
    flags = re.search(r"\(command line: ([^)]*)\)$", lines[0])
    assert flags and flag in flags.group(1).split(", "), f"({flag!r} not in the command line's flags) {lines[0]}"
    return lines[0]


@pytest.mark.parametrize("path", ["launch", "torchrun"])
@pytest.mark.parametrize("flags, flag, words", TABLE, ids=[" ".join(f) for f, _, _ in TABLE])
def test_a_flag_out_of_range_is_one_sentence_before_any_rank_starts(tmp_path, monkeypatch, capsys, nothing_starts,
                                                                     path, flags, flag, words):
    args = ["--dp", "2", *QUICK, *_refused(flags, tmp_path)]  # the flag under test last: it wins
    if path == "torchrun":
        _as_torchrun_rank(monkeypatch)
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "", out
    line = _one_sentence(err, flag, words)
    assert line.startswith("coursekit train (rank 0): " if path == "torchrun" else "coursekit train: "), line


@pytest.mark.parametrize("config", [Config(seq_len=3, batch=2), Config(vocab=2, batch=2),
                                    Config(d_model=1, heads=1, batch=2), Config(layers=1, batch=2),
                                    Config(seed=-(10**12), batch=2), Config(seed=10**12, batch=2)],
                         ids=lambda c: f"seq_len{c.seq_len}-vocab{c.vocab}-d{c.d_model}-L{c.layers}-seed{c.seed}")
def test_the_lowest_sizes_and_the_widest_seeds_train(config):
    """The ranges are the model's and the data's, not tighter: each edge passes the check and trains a step
    (one process). One beyond each was seen failing inside the model, the data or torch before it was checked."""
    config = replace(config, steps=1)
    check(config)
    (loss,) = one_process_losses(config)
    assert math.isfinite(loss), loss


def test_a_large_lr_and_timeout_are_legal():
    """``--lr 1e6`` is not the check's to refuse (it may be a mistake, but it runs): the divergence stop's, below."""
    check(Config(lr=1e6, timeout=1e9))


BOUND_16 = math.log(16) + 25  # the divergence bound for the default vocabulary: a uniform guess's loss + 25 nats


def test_a_spike_that_comes_back_is_not_a_divergence():
    """With 2 tokens and lr 0.1 (one process, 4 steps) the loss spikes above ten times a uniform guess's, ln 2, then
    learns below a uniform guess at once: a bound of ten times ln(vocab) would have stopped a run that learns."""
    config = Config(vocab=2, lr=0.1, steps=4, batch=8)
    losses = one_process_losses(config)
    assert max(losses) > 10 * math.log(2) and losses[-1] < math.log(2), f"no spike that comes back: {losses}"
    for step, loss in enumerate(losses):
        assert diverged(config, step, loss, step - 1 if step else None, losses[step - 1]) is None, (step, losses)


def _spied_launch(monkeypatch) -> list:
    """coursekit.launch as it is, every rank's result kept."""
    results, launch = [], coursekit.launch

    def spy(*args, **kwargs):
        results.extend(launch(*args, **kwargs))
        return results

    monkeypatch.setattr(coursekit, "launch", spy)
    return results


DIVERGING = {  # name: (flags, what the sentence says of the loss)
    # the pipeline: only the last stage computes the loss, and broadcasts it; a finite loss far above the bound
    "pp2-lr1-above-the-bound": (["--pp", "2", "--microbatches", "2", "--lr", "1"], "above"),
    # a mixture of experts with the balance loss: nan, and the sentence names aux_weight too
    "dp2-moe-lr1e6-nan": (["--dp", "2", "--experts", "4", "--aux-weight", "0.01", "--lr", "1e6"], "nan"),
}


@pytest.mark.parametrize("name", DIVERGING)
def test_a_diverged_loss_stops_every_rank_after_the_same_step(tmp_path, monkeypatch, capsys, name):
    """Two ranks under coursekit.launch: every rank returns the same sentence (none is left inside a collective:
    that would be a rank's traceback, or a timeout), the command line says it once, exit 2; the log named, which an
    earlier run wrote, is left as it was. A rank left waiting meets ``--timeout 30`` and fails the test as launch's
    LaunchTimeout; the seconds themselves are not asserted (a timing: 3-17 s here, 31 s once at load 17)."""
    flags, kind = DIVERGING[name]
    log = tmp_path / "log.json"
    log.write_text("an earlier run's curve\n")
    results = _spied_launch(monkeypatch)
    status = main([*flags, *QUICK, "--timeout", "30", "--log-json", str(log)])  # a rank left waiting: 30 s
    err = capsys.readouterr().err
    assert status == 2, f"the run should stop (exit 2), not exit {status}: {err[-2000:]}"
    line = _one_sentence(err, "--lr", "the loss diverged at step ")
    said = [result.get("refused") for result in results]
    assert len(said) == 2 and said[0] and said == [said[0]] * 2, f"every rank should stop alike: {said}"
    step, of = map(int, re.search(r"at step (\d+) of (\d+)", line).groups())
    assert 2 <= step < of == 4, line   # after a finite first step, before the end
    assert re.search(rf"after \d+\.\d+ at step {step - 1};", line), line
    loss = line.split(f"at step {step} of 4: ")[1].split(",")[0]
    if kind == "nan":
        assert loss == "nan", line
        assert "or a smaller aux_weight than aux_weight = 0.01" in line and "--aux-weight" in line, line
    else:
        assert float(loss) > BOUND_16 and f"above {BOUND_16:.4g}" in line, line
    assert "use a smaller learning rate, e.g. lr = " in line, line
    assert log.read_text() == "an earlier run's curve\n", "a diverged run should not write its log"


def test_a_diverged_loss_under_torchrun(tmp_path):
    """A real torchrun of 2 ranks, ``--lr 1e6``: nan at step 2. Each rank says the sentence before it leaves the
    process group (the first to exit makes torchrun stop the other with SIGTERM, so a rank's line is required
    only where it was not stopped so), exits 2, and no rank shows a traceback of its own (a rank left waiting would
    meet ``--timeout 60`` and show one)."""
    rc, out, err = _finish(_job(TORCHRUN + ["--standalone", "--nproc-per-node", "2", "-m", "coursekit.capstone",
                                            "--dp", "2", "--lr", "1e6", *QUICK, "--timeout", "60"]), 90)
    assert rc != 0, f"torchrun exited {rc}:\n{err[-3000:]}"
    assert "/coursekit/" not in "".join(re.findall(r'File "[^"]*"', err)), f"a rank's traceback:\n{err[-3000:]}"
    lines = [line for line in err.splitlines() if line.startswith("coursekit train (rank ")]
    assert lines, f"no rank said why:\n{err[-3000:]}"
    for line in lines:
        assert "the loss diverged at step 2 of 4: nan" in line and line.endswith("(command line: --lr)"), line
    codes = dict(re.findall(r"rank\s*:\s*(\d+)[^\n]*\n[^\n]*exitcode\s*:\s*(-?\d+)", err))
    for rank in ("0", "1"):
        said = any(line.startswith(f"coursekit train (rank {rank}): ") for line in lines)
        stopped = codes.get(rank) in ("143", "-15")  # torchrun's SIGTERM, through the rank's signal thread or not
        assert said or stopped, f"rank {rank} did not say the sentence:\n{err}"


def test_a_run_past_its_timeout_is_one_sentence(capsys):
    """Started by the command, ``--timeout`` is the whole run's deadline: past it, launch stops every rank and the
    command says so in one sentence, exit 2 (1,000 steps cannot end in half a second). Planted bug, seen failing:
    the ``except coursekit.LaunchTimeout`` removed -> "coursekit.launch.LaunchTimeout: ranks [0, 1] still running
    after 0.5 s ..." raised through main()."""
    status = main(["--dp", "2", "--steps", "1000", "--batch", "8", "--quiet", "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert status == 2, err
    line = _one_sentence(err, "--timeout", "ranks [0, 1] were still running after timeout = 0.5 s")
    assert "use a larger timeout" in line, line


def test_zero2_logs_the_dtype_it_computed_in(tmp_path, capsys):
    """ZeRO-2/3 of a whole model is chapter 02's strategy, not the composed one: its log said compute_dtype null.
    With --precision bf16 its flat buffer, which the forward runs in, is bfloat16."""
    log = tmp_path / "log.json"
    assert main(["--dp", "2", "--zero", "2", "--precision", "bf16", *QUICK, "--log-json", str(log)]) == 0, \
        capsys.readouterr().err[-2000:]
    summary = json.loads(log.read_text())
    assert summary["compute_dtype"] == "bfloat16", f"the log says compute_dtype {summary['compute_dtype']}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
