"""The capstone trainer under torchrun: its loss curve is the one-process curve, step for step.

Each job is a real ``torchrun`` (env rendezvous, one process per rank), bounded in time; its process group is
killed whatever happens, so no rank outlives its test. The reference is chapter 02's one-process loop
(``train(0, 1, "single")``) on the same model, seed and global batches -- it shares no code with the
composed strategy but the model and the data.

Planted bugs, seen failing:
* ``--batch`` not handed to the loop (the default 16 sequences a step) -> every layout's curve differs at step 0;
* a refused layout answered with exit status 0 under torchrun -> test_a_refused_layout_under_torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coursekit.capstone import Config, one_process_losses
from coursekit.capstone.__main__ import main

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
STEPS = 4
COMMON = ["--steps", str(STEPS), "--batch", "8", "--quiet"]


def _job(args: list[str], timeout: float = 120.0, env: dict | None = None) -> subprocess.Popen:
    """Start one torchrun in its own session (so the whole tree can be killed at once)."""
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})


def _finish(job: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", f"timed out after {timeout} s"
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)  # the agent and every rank it started
        except ProcessLookupError:
            pass
        job.wait()
    return job.returncode, out, err


def torchrun(nproc: int, args: list[str], log: Path, timeout: float = 120.0) -> dict:
    rc, out, err = _finish(_job(TORCHRUN + ["--standalone", "--nproc-per-node", str(nproc), "-m",
                                            "coursekit.capstone", *args, *COMMON, "--log-json", str(log)]), timeout)
    assert rc == 0, f"torchrun exited {rc}:\n{err[-3000:]}"
    return json.loads(log.read_text())


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """One process, chapter 02's loop: the curve every layout must reproduce."""
    return one_process_losses(Config(batch=8, steps=STEPS))


BF16_LAYOUTS = {
    "dp2xtp2": ["--dp", "2", "--tp", "2"],
    "pp2xdp2": ["--pp", "2", "--dp", "2", "--microbatches", "2"],
    "dp2xsp2": ["--dp", "2", "--sp", "2"],
}


@pytest.mark.parametrize("name", BF16_LAYOUTS)
def test_bf16_under_torchrun_is_within_bf16s_band_of_one_process(tmp_path, name):
    """``--precision bf16`` (issue 41): each step's loss within rtol 2e-2 -- the course's bf16 band
    (``coursekit.measure.verify.TOLERANCES``: about five roundings of bf16's 8 significant bits) -- of PyTorch's
    autocast recipe on one process. Gradients and weights are held to the same band under coursekit.launch
    (tests/test_parallel_hybrid_precision.py, which also reads the 16 bits from what the ranks sent). bf16 moves
    this loss by about 1e-4 only, so the band alone would pass an fp32 run: the strategy's report of what its
    forwards ran in is checked too. Planted bug, seen failing: --precision not handed to the strategy -> "the
    ranks computed in float32"."""
    log = torchrun(4, [*BF16_LAYOUTS[name], "--precision", "bf16"], tmp_path / "log.json")
    assert log["compute_dtype"] == "bfloat16", f"the ranks computed in {log['compute_dtype']}"
    want = one_process_losses(Config(batch=8, steps=STEPS, precision="bf16"))
    for step, (got, expected) in enumerate(zip(log["losses"], want, strict=True)):
        assert abs(got - expected) <= 2e-2 * expected, f"step {step}: {got!r} against one process's {expected!r}"


def long_reference() -> list[float]:
    """Twice the steps of :func:`reference` (its first half is the same curve): the restarted job's."""
    return one_process_losses(Config(batch=8, steps=2 * STEPS))


def _same_curve(losses: list[float], reference: list[float]) -> None:
    assert len(losses) == len(reference)
    for step, (got, want) in enumerate(zip(losses, reference)):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {step}: {got!r} against one process's {want!r}"


# Under torchrun, the layouts whose start differs: the composed strategy on two axes with a pipeline and ring
# attention (every kind of group it builds), and per-unit ZeRO-3 (the other strategy run() picks); the two-node
# test below adds dp2×tp2 over two agents. Every other layout's numbers are the same code under coursekit.launch,
# held to one process in tests/test_parallel_hybrid.py (eleven layouts, and dp2×tp2×pp2 on 8 ranks): here each
# torchrun costs a fresh interpreter importing torch per rank, 20-26 s of make test's time.
LAYOUTS = {
    "pp2xsp2": (4, ["--pp", "2", "--sp", "2", "--microbatches", "2"]),
    "dp4-zero3": (4, ["--dp", "4", "--zero", "3"]),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_under_torchrun_equals_one_process(reference, tmp_path, name):
    nproc, args = LAYOUTS[name]
    _same_curve(torchrun(nproc, args, tmp_path / "log.json")["losses"], reference)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_one_machine(reference, tmp_path):
    """Two torchrun agents, ``--nnodes 2 --nproc-per-node 2`` with the c10d rendezvous, form one job of 4 ranks.

    c10d gives group ranks in the order the agents reach the rendezvous, not by ``--node-rank`` (that flag is for
    the static rendezvous): which agent holds rank 0 is torch's choice, and on a busy machine the agent started
    first is not always the first there. What the course promises is read from the run itself: the one-process
    curve; each node's ranks consecutive, so each ``tp`` group (tp innermost) lies inside one node; rank 0's lines
    printed once, by the agent the log says started rank 0 (``placement``: each rank's group rank and its agent's
    process id). Before, the test assumed the agent started 3 s earlier held rank 0: it failed
    on a quiet fresh clone once (issue 60). Planted, seen failing: every node's first rank printing rank 0's lines
    -> "rank 0's lines came from agent(s) [0, 1]; the log puts rank 0 under agent(s) [0]".
    """
    port, log = _free_port(), tmp_path / "log.json"
    jobs = {node: _job(TORCHRUN + ["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node),
                                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                   "-m", "coursekit.capstone", "--dp", "2", "--tp", "2", *COMMON[:-1],
                                   "--log-json", str(log)])   # not --quiet: rank 0's lines show where it ran
            for node in (0, 1)}
    results = {node: _finish(job, 120) for node, job in jobs.items()}
    for node, (rc, _, err) in results.items():
        assert rc == 0, f"node {node} exited {rc}:\n{err[-3000:]}"
    summary = json.loads(log.read_text())
    _same_curve(summary["losses"], reference)
    placement = summary["placement"]
    assert [p["node"] for p in placement] == [0, 0, 1, 1], f"each node's ranks should be consecutive: {placement}"
    for group in summary["tp_groups"]:
        assert len({placement[r]["node"] for r in group}) == 1, f"tp group {group} spans nodes {placement}"
    printed = [node for node, (_, out, _) in results.items() if "coursekit capstone: dp2×tp2" in out]
    holds_rank_0 = [node for node, job in jobs.items() if job.pid == placement[0]["agent_pid"]]
    assert printed == holds_rank_0 and len(printed) == 1, \
        f"rank 0's lines came from agent(s) {printed}; the log puts rank 0 under agent(s) {holds_rank_0}"


def test_a_torchrun_rank_leaves_without_the_interpreters_shutdown(tmp_path):
    """A rank under torchrun ends with os._exit: gloo's worker may still be freeing the last collective's tensors,
    which takes the GIL, and asked for during the interpreter's shutdown it aborts the rank (SIGABRT, "terminate
    called without an active exception": 3 of 70 runs of ``--pp 2 --sp 2`` beside two busy loops). What shows
    the shutdown ran: an ``atexit`` handler the rank registers (through a sitecustomize, in the ranks only).
    Planted bug, seen failing: ``return 0`` after ``destroy_process_group()`` instead of ``os._exit(0)``."""
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "if 'LOCAL_RANK' in os.environ:  # torchrun's ranks, not its agent\n"
        "    atexit.register(lambda: print('the interpreter shut down', flush=True))\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    rc, out, err = _finish(_job(TORCHRUN + ["--standalone", "--nproc-per-node", "2", "-m", "coursekit.capstone",
                                            "--dp", "2", *COMMON], env=env), 120)
    assert rc == 0, f"torchrun exited {rc}:\n{err[-3000:]}"
    assert "the interpreter shut down" not in out + err, "a rank ran the interpreter's shutdown after training"


def test_a_refused_layout_exits_2_before_any_rank_starts(capsys):
    """3 × 2 degrees for 4 ranks: the sentence says what to change in the library's words, and the command line adds
    its flags; nothing is launched (exit status 2). Planted, seen failing: the CLI printing the error alone ->
    "(command line: --sp, --tp)" missing."""
    assert main(["--dp", "3", "--tp", "2", "--sp", "2"]) == 2
    err = capsys.readouterr().err
    assert "tp = 2 and sp = 2 together: ring attention over tensor-parallel heads" in err, err
    assert err.rstrip().endswith("(command line: --sp, --tp)"), err
    assert main(["--dp", "2", "--microbatches", "4", "--batch", "4"]) == 2
    err = capsys.readouterr().err
    assert "global_batch = 4 over dp = 2" in err and "(command line: --dp, --microbatches, --batch)" in err, err
    assert main(["--zero", "5"]) == 2 and "zero = 5: use 0 (none), 1, 2 or 3. (command line: --zero)" in \
        capsys.readouterr().err   # one check, the library's: argparse no longer has its own choices
    assert main(["--schedule", "1f2b"]) == 2 and "schedule = '1f2b': use one of" in capsys.readouterr().err


def test_a_refused_layout_under_torchrun(tmp_path):
    """Under torchrun the degrees must multiply to its world size: every rank says so and exits 2. Rank 0 alone
    saying it was a race: rank 1 exited first, torchrun stopped rank 0 before it printed (a fresh make test met it;
    seen failing 5 times in 5 with rank 0 delayed 0.5 s before its check)."""
    rc, _, err = _finish(_job(TORCHRUN + ["--standalone", "--nproc-per-node", "2", "-m", "coursekit.capstone",
                                          "--dp", "4", "--quiet"]), 60)
    assert rc != 0 and "multiply to 2" in err, err[-2000:]


def test_without_torchrun_it_launches_its_own_ranks(reference, tmp_path):
    """``coursekit train`` with no torchrun around it starts the ranks itself (coursekit.launch)."""
    log = tmp_path / "log.json"
    assert main(["--dp", "2", "--pp", "2", "--microbatches", "2", *COMMON, "--log-json", str(log)]) == 0
    _same_curve(json.loads(log.read_text())["losses"], reference)


def test_a_killed_rank_is_survived_under_torchrun_max_restarts(reference, tmp_path):
    """``torchrun --max-restarts 3`` with ``--checkpoint-dir D --resume``: rank 1 SIGKILLs itself inside the save
    after step 6 (the first attempt only). torchrun stops rank 0 and restarts both; they meet again under a new
    prefix of the agent's store (:func:`coursekit.capstone.__main__._store_of_this_attempt`), skip the torn step-6
    checkpoint, resume from step 4's and finish: steps 5-8 equal one process's. Twice: without the prefix, 1 run in
    6 recovered here (the others hung or were refused by gloo's connectFullMesh, meeting the dead ranks' keys).
    Planted bug, seen failing: the prefix left out -> "run 0: torchrun exited -9: timed out after 180 s"."""
    for attempt in range(2):
        folder, log = tmp_path / f"run{attempt}", tmp_path / f"log{attempt}.json"
        job = _job(TORCHRUN + ["--standalone", "--nproc-per-node", "2", "--max-restarts", "3", "-m",
                               "coursekit.capstone", "--dp", "2", "--steps", str(2 * STEPS), "--batch", "8",
                               "--checkpoint-dir", str(folder), "--checkpoint-every", "2", "--resume",
                               "--log-json", str(log)], env={"COURSEKIT_KILL_DURING_SAVE": f"1:{STEPS + 2}"})
        rc, out, err = _finish(job, 180)
        assert rc == 0, f"run {attempt}: torchrun exited {rc}:\n{err[-3000:]}"
        assert f"step-{STEPS + 2:06d}.tmp: incomplete (the job stopped while saving it)" in out, out[-2000:]
        summary = json.loads(log.read_text())
        assert summary["first_step"] == STEPS, (summary["first_step"], out[-2000:])
        _same_curve(summary["losses"], long_reference()[STEPS:])
