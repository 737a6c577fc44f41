"""``coursekit train`` (or ``python -m coursekit.capstone``): train the course transformer on any layout.

Under ``torchrun`` every process is one rank (the rendezvous comes from the environment: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``)::

    torchrun --standalone --nproc-per-node 4 -m coursekit.capstone --dp 2 --tp 2 --steps 20
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --rdzv-backend c10d \\
             --rdzv-endpoint 127.0.0.1:29400 -m coursekit.capstone --dp 2 --tp 2      # and --node-rank 1

A lost rank is survived the way real jobs survive it: torchrun restarts every rank, and they resume from the last
complete checkpoint (a save the lost rank left torn is skipped)::

    torchrun --standalone --nproc-per-node 2 --max-restarts 3 -m coursekit.capstone --dp 2 \\
             --checkpoint-dir ckpt --checkpoint-every 2 --resume

Without ``torchrun`` it starts the ranks itself, on this machine, with :func:`coursekit.launch`::

    coursekit train --pp 2 --dp 2 --microbatches 4 --log-json curve.json
    coursekit train --dp 2 --tp 2 --precision bf16     # any layout: bf16 compute, fp32 weights, gradients, Adam
    coursekit train --dp 4 --ep 2 --experts 4          # a mixture of experts: 4 ranks, each holds 2 of the 4
    torchrun --standalone --nproc-per-node 2 -m coursekit.capstone --dp 2 --ep 2 --experts 4 --top-k 1

``--ep`` borrows from ``--dp`` (as torchtitan's and the cost model's layouts do): ``--dp 4 --ep 2`` is 4 ranks,
each with its own slice of the batch, in pairs that split the experts; ``ep`` divides ``dp`` and ``--experts``.

A layout that cannot run, or a setting out of its range, is refused before any rank starts, with what to change
(exit status 2). So is, before the first step and on every rank, a ``--checkpoint-dir`` that cannot hold a
checkpoint (a file, not writable, no room), one that holds another run's checkpoints without ``--resume``
(``--overwrite`` sets them aside, never deletes them), and a checkpoint ``--resume`` cannot use (damaged, or of
another model). A run whose loss diverges (not finite, or far above a uniform guess's) stops on every rank after
the same step, saying which and what to try. Each: one sentence, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from datetime import timedelta

from ..comm.devices import default_backend
from .run import Config, check, run

__all__ = ["main", "parse", "in_torchrun", "FLAGS", "with_flags"]

#: The library's name of each setting -> its flag: the library's errors say ``tp = 3``, the command line adds ``--tp``.
FLAGS = {"pp": "--pp", "dp": "--dp", "sp": "--sp", "tp": "--tp", "zero": "--zero", "schedule": "--schedule",
         "stages_per_rank": "--stages-per-rank", "micro_batches": "--microbatches", "global_batch": "--batch",
         "layers": "--layers", "d_model": "--d-model", "heads": "--heads", "steps": "--steps",
         "checkpoint_dir": "--checkpoint-dir", "resume": "--resume", "precision": "--precision",
         "ep": "--ep", "experts": "--experts", "top_k": "--top-k", "aux_weight": "--aux-weight",
         "bias_rate": "--bias-rate", "vocab": "--vocab", "seq_len": "--seq-len", "lr": "--lr", "seed": "--seed",
         "timeout": "--timeout", "log": "--log-json", "overwrite": "--overwrite"}


def with_flags(error: Exception) -> str:
    """``error``'s sentence, and the flags of the settings it names (``tp = 3 ... (command line: --tp)``)."""
    text = str(error)
    named = [flag for name, flag in FLAGS.items()   # "tp = 3", "checkpoint_dir": a setting, not a word of a sentence
             if re.search(rf"(?<![\w-]){name}(?=\s?=(?!=))" if "_" not in name else rf"(?<![\w-]){name}\b", text)]
    return f"{text} (command line: {', '.join(named)})" if named else text


def parse(argv: list[str] | None = None) -> Config:
    """The command line as a :class:`~coursekit.capstone.run.Config`."""
    d = Config()
    p = argparse.ArgumentParser(prog="coursekit train", description=__doc__.split("\n\n")[0])
    layout = p.add_argument_group("layout (the degrees multiply to the number of ranks; --ep borrows from --dp)")
    for axis, what in (("dp", "data"), ("tp", "tensor (heads, MLP, vocabulary)"), ("pp", "pipeline (stages)"),
                       ("sp", "sequence (ring attention)")):
        layout.add_argument(f"--{axis}", type=int, default=1, help=f"{what} parallel degree (default 1)")
    layout.add_argument("--zero", type=int, default=0,
                        help="ZeRO stage over dp: 0 (none), 1 with any layout, 2 and 3 (a layer gathered at a time) "
                             "on pure data parallelism")
    layout.add_argument("--schedule", default=d.schedule, help="gpipe, 1f1b, interleaved or zb_h1")
    layout.add_argument("--stages-per-rank", type=int, default=1, help="v, for --schedule interleaved")
    layout.add_argument("--microbatches", type=int, default=1, help="per step and data-parallel slice (m)")
    moe = p.add_argument_group("mixture of experts (the transformer's MLPs as experts: chapter 07's 'expert')")
    moe.add_argument("--experts", type=int, default=d.experts,
                     help="experts per block (default 0: the dense transformer)")
    moe.add_argument("--ep", type=int, default=d.ep,
                     help="expert parallel degree: the experts split over groups of ep of the dp ranks (ep borrows "
                          "from dp and adds no ranks: --dp 4 --ep 2 is 4 ranks; default 1)")
    moe.add_argument("--top-k", type=int, default=d.top_k, help=f"experts per token (default {d.top_k})")
    moe.add_argument("--aux-weight", type=float, default=d.aux_weight,
                     help="the Switch Transformer's balance loss, this times it added to the loss (default 0: off)")
    moe.add_argument("--bias-rate", type=float, default=d.bias_rate,
                     help="DeepSeek-V3's balancing: the routers' bias nudged by this per step (default 0: off)")
    run_ = p.add_argument_group("run")
    run_.add_argument("--steps", type=int, default=d.steps)
    run_.add_argument("--seed", type=int, default=d.seed)
    run_.add_argument("--batch", type=int, default=d.batch, help="sequences per step, over all data ranks")
    run_.add_argument("--lr", type=float, default=d.lr)
    run_.add_argument("--precision", default=d.precision,
                      help="fp32, bf16 or fp16: the dtype the model computes in (weights, gradients, Adam: fp32; "
                           "fp16 with a loss scale)")
    run_.add_argument("--log-json", dest="log", default=None, help="write the loss curve and tokens/s to this JSON file")
    run_.add_argument("--checkpoint-dir", default=None)
    run_.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end)")
    run_.add_argument("--resume", action="store_true", help="start from the last complete checkpoint")
    run_.add_argument("--overwrite", action="store_true",
                      help="without --resume: start at step 0 in a --checkpoint-dir that holds another run's "
                           "checkpoints, setting them aside (renamed, never deleted)")
    run_.add_argument("--quiet", action="store_true", help="no line per step")
    run_.add_argument("--timeout", type=float, default=d.timeout, help="under torchrun, seconds a rank waits for another; started by this command, "
                      "the whole run's deadline (default 300)")
    model = p.add_argument_group("model (the course transformer)")
    model.add_argument("--layers", type=int, default=d.layers)
    model.add_argument("--d-model", type=int, default=d.d_model)
    model.add_argument("--heads", type=int, default=d.heads)
    model.add_argument("--vocab", type=int, default=d.vocab)
    model.add_argument("--seq-len", type=int, default=d.seq_len)
    a = p.parse_args(argv)
    return Config(dp=a.dp, tp=a.tp, pp=a.pp, sp=a.sp, zero=a.zero, schedule=a.schedule,
                  stages_per_rank=a.stages_per_rank, microbatches=a.microbatches, steps=a.steps, seed=a.seed,
                  batch=a.batch, seq_len=a.seq_len, layers=a.layers, d_model=a.d_model, heads=a.heads,
                  vocab=a.vocab, lr=a.lr, precision=a.precision, experts=a.experts, ep=a.ep, top_k=a.top_k,
                  aux_weight=a.aux_weight, bias_rate=a.bias_rate, log=a.log, checkpoint_dir=a.checkpoint_dir,
                  checkpoint_every=a.checkpoint_every, resume=a.resume, overwrite=a.overwrite, quiet=a.quiet,
                  timeout=a.timeout)


def in_torchrun() -> bool:
    """Whether ``torchrun`` started this process (its rendezvous variables are set)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _torchrun(config: Config) -> int:
    """One rank of a ``torchrun`` job: join the process group from the environment, train, leave."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _leave_on_signal(rank, config)
    try:
        check(config, world)
    except ValueError as error:
        # every rank says it: the first to exit makes torchrun stop the others, rank 0 perhaps before it printed
        _say(f"coursekit train (rank {rank}): {with_flags(error)}")
        return 2
    if os.environ["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every peer is on this machine
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # the ranks on this machine: one GPU each, if there are
    timeout = timedelta(seconds=config.timeout)
    dist.init_process_group(default_backend(local), timeout=timeout, store=_store_of_this_attempt(world, timeout),
                            rank=rank, world_size=world)
    try:
        refused = run(rank, world, config).get("refused")
        if refused:  # a damaged checkpoint, a diverged loss: every rank says it, as a refused layout, before it
            # leaves the group (the first rank to exit makes torchrun stop the others)
            _say(f"coursekit train (rank {rank}): {with_flags(refused)}")
            _said_everywhere()
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's shutdown, as coursekit.launch's ranks do, a refused run too. The group lives on
    # after destroy_process_group() (references the run leaves), and gloo's worker thread may still be letting go of
    # the last collective's tensors (all_gather_object's): freeing one that Python made takes the GIL, and a
    # thread that asks for it while the interpreter shuts down aborts the rank -- SIGABRT, "terminate called
    # without an active exception", in 3 of 70 torchrun --pp 2 --sp 2 runs beside two busy loops (the same
    # cause: pytorch/pytorch#190489, #179291). Everything the run writes is written and closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2 if refused else 0)


def _say(line: str) -> None:
    """``line`` on stderr in one write: torchrun starts its ranks with ``python -u``, where print() writes the text
    and its newline apart, so two ranks saying their sentence at once interleaved them on one line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _leave_on_signal(rank: int, config) -> None:
    """Ctrl-C (SIGINT) or torchrun's stop (SIGTERM, or the SIGINT it passes on): leave at once, rank 0 saying so.

    Python runs a signal's handler in the main thread, between two bytecodes, so a rank blocked in C++ -- waiting
    for a peer in ``init_process_group`` or a collective -- never ran it: torchrun waited its 30 s and killed it,
    and the ranks that did run it printed a KeyboardInterrupt traceback each (~130 lines for 2 ranks). So the
    signals are blocked in the main thread, and so in every thread started after it (gloo's, the store's), and
    one thread waits for them (``sigwait`` needs no bytecode of the main thread): it writes one line and ends the
    process. Nothing is lost: a checkpoint becomes one only by its final rename (:mod:`.checkpoint`)."""
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)

    def wait() -> None:
        got = signal.sigwait(stops)
        if rank == 0 and got == signal.SIGINT:  # SIGTERM is torchrun stopping us for a peer that failed: it says why
            os.write(2, f"{_stopped(signal.Signals(got), config)}\n".encode())
        os._exit(128 + got)

    threading.Thread(target=wait, name="coursekit-signals", daemon=True).start()


def _stopped(sig: signal.Signals, config) -> str:
    where = f"; --resume continues from the last checkpoint in {config.checkpoint_dir}" if config.checkpoint_dir else ""
    return f"coursekit train: stopped by {sig.name}{where}"


def _said_everywhere() -> None:
    """Wait until every rank has printed its refusal: torchrun stops the other ranks as soon as one exits.

    A barrier after the print: no rank leaves before all have said it. A rank that leaves the barrier first may
    close its sockets while a peer is still reading the barrier's last message; that peer has said its sentence
    already, so a failure there is not reported (a traceback would be the only output it added)."""
    import torch.distributed as dist

    try:
        dist.barrier()
    except Exception:  # see above: the sentence is out, and the rank exits 2 either way
        pass


#: The key of the shared store every rank of every attempt adds 1 to, once (see :func:`_store_of_this_attempt`).
JOINED = "coursekit/joined"


def _store_of_this_attempt(world: int, timeout: timedelta):
    """The store the process group meets in: torchrun's, under a prefix of its own for each attempt of the job.

    ``torchrun --max-restarts`` restarts every rank after one dies. Since PyTorch 2.5 the ranks meet in the agent's
    TCPStore (``TORCHELASTIC_USE_AGENT_STORE``), which outlives them: the restarted ranks find the dead ones' keys
    there -- gloo's addresses, the barrier's counts -- and connect to ranks that are gone ("connectFullMesh"), or
    wait at a barrier counted for the last attempt (pytorch/pytorch#135712; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    on torchrun avoids it too). So each rank adds 1 to one counter as it joins: attempt ``a`` of a job of ``world``
    ranks reads ``a·world + 1`` ... ``(a+1)·world`` (all of an attempt's ranks join before any rank is restarted),
    and every rank of it meets under ``attempt{a}/``. (``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt: each
    node's agent counts only its own restarts.)"""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None  # rank 0 hosts a store of its own, new every attempt: init_process_group builds it
    import torch.distributed as dist

    shared = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                           timeout=timeout)
    attempt = (shared.add(JOINED, 1) - 1) // world
    return dist.PrefixStore(f"attempt{attempt}/", shared)


def _too_late(late) -> str:
    """A :class:`~coursekit.launch.LaunchTimeout` in one sentence: which ranks, what each was doing, what to try."""
    doing = sorted({re.sub(r"\s*\((.*)\)$", r", \1", note.split(";")[0].strip())
                    for note in late.waiting.values() if note})   # "busy (not inside ...)" -> "busy, not inside ..."
    return with_flags(f"ranks {late.ranks} were still running after timeout = {late.timeout:g} s"
                      f"{' (' + '; '.join(doing) + ')' if doing else ''} and were stopped: if the run is just slow, "
                      f"use a larger timeout (seconds for the whole run)")


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    if in_torchrun():
        return _torchrun(config)
    try:
        check(config)
    except ValueError as error:
        print(f"coursekit train: {with_flags(error)}", file=sys.stderr)
        return 2
    import coursekit

    try:
        results = coursekit.launch(run, config.world_size, config, timeout=config.timeout)
    except KeyboardInterrupt:  # launch stopped every rank before raising it (coursekit.launch.interrupts)
        print(_stopped(signal.SIGINT, config), file=sys.stderr)
        return 128 + signal.SIGINT
    except coursekit.LaunchTimeout as late:  # launch stopped every rank before raising it
        print(f"coursekit train: {_too_late(late)}", file=sys.stderr)
        return 2
    if "refused" in results[0]:
        print(f"coursekit train: {with_flags(results[0]['refused'])}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
