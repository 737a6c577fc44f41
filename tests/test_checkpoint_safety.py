"""Checkpoints that cannot be used, or a directory that cannot hold them: one sentence, exit status 2 (issue 60).

Each case runs ``coursekit train`` (:func:`~coursekit.capstone.__main__.main`, which starts 2 ranks with
coursekit.launch) on a tiny model, in a copy of one saved directory (``step-000001``, ``step-000002``: dp2, 2
layers of d_model 16, 2 heads), and checks: status 2, one line saying it (the launcher's; the ranks agreed on
it), no frame of ours in any rank's output, and the directory, hashed before and after, unchanged but for the
step directories the run itself wrote. Before: bytes damaged at the same size gave four tracebacks
(DCP's ``CheckpointException`` is a BaseException: ``except Exception`` did not catch it); a checkpoint of
more layers, or of other heads at the same width, resumed silently; a ``--checkpoint-dir`` that was a file
failed after the training was done; a torn ``.tmp`` and an unfinished step directory were removed with what
was in them; a fresh run in a used directory overwrote another run's steps; ``--resume`` past ``--steps``
said nothing.

Planted bugs, seen failing (restored after):
* ``except Exception`` again instead of DCP's ``CheckpointException``, around ``dcp.load`` ->
  test_an_old_checkpoint_damaged_inside_gets_dcp_error_as_a_sentence: ``RankError: rank 0 failed`` whose
  traceback ends ``torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0,
  1])``; around ``dcp.save`` -> test_a_save_past_the_file_size_limit, the same;
* the rename aside replaced by ``shutil.rmtree`` in save ->
  test_a_torn_save_and_an_unfinished_step_are_set_aside_not_removed: "no step-000003.incomplete-* for both:
  ['step-000001', 'step-000002', 'step-000003']" (the files put there were gone);
* the checksum skipped in verify -> test_same_size_damage_is_refused_by_its_checksum...: status 0 (the damaged
  shard loaded without a word, and the run trained on);
* the model's settings not compared -> test_other_heads_at_the_same_width: status 0 (every shape agrees);
* no agreement (each rank raising its own verdict at once) ->
  test_no_rank_leaves_before_every_rank_has_its_verdict: "every rank raises the same sentence", rank 0 had None;
* the free room not compared -> test_not_enough_room_for_one_checkpoint: status 0;
* a fresh run not refused in another run's directory -> test_a_fresh_run_refuses_a_directory_of_another_run:
  status 0.
* a format-2 meta.json without "files" taken for an older one -> test_a_meta_json_that_lost_its_checksums:
  "DID NOT RAISE CheckpointError".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import coursekit
from coursekit.capstone import Config, run
from coursekit.capstone import checkpoint, checkpoint_dir
from coursekit.capstone.__main__ import main

TINY = ["--layers", "2", "--d-model", "16", "--heads", "2", "--seq-len", "8"]
COMMON = ["--dp", "2", "--batch", "8", "--quiet", *TINY]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two complete checkpoints, after steps 1 and 2 of dp2: the folder holding them."""
    folder = tmp_path_factory.mktemp("good")
    config = Config(dp=2, batch=8, steps=2, checkpoint_every=1, quiet=True, checkpoint_dir=str(folder), layers=2,
                    d_model=16, heads=2, seq_len=8)
    coursekit.launch(run, 2, config, timeout=120)
    assert [p.name for p in sorted(folder.iterdir())] == ["step-000001", "step-000002"]
    return folder


def _copy(saved, tmp_path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(saved, folder)
    return folder


def _tree(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` -> its sha256 (a file) or "dir"."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


def _unchanged_but_new_steps(before: dict, folder: Path) -> list[str]:
    """Check nothing that was in ``folder`` changed or went; return the step directories the run added."""
    after = _tree(folder)
    new = sorted({key.split("/")[0] for key in after if key not in before})
    assert all(re.fullmatch(r"step-\d{6}", name) for name in new), new
    assert {k: v for k, v in after.items() if k.split("/")[0] not in new} == before
    return new


def _train(capfd, *args) -> tuple[int, str]:
    capfd.readouterr()
    status = main([*COMMON, *args])
    out, err = capfd.readouterr()
    return status, out + err


def _refused(status: int, said: str, *phrases: str) -> str:
    """Status 2, one sentence (the launcher's line), no traceback and no frame of ours; returns the sentence."""
    assert status == 2, f"status {status}, not refused: {said[-3000:]}"
    assert "Traceback" not in said and not re.search(r'File ".*coursekit/', said), said[-3000:]
    lines = [line for line in said.splitlines() if "coursekit train:" in line]
    assert len(lines) == 1, said[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def _damage(file: Path, where: str = "middle") -> None:
    data = bytearray(file.read_bytes())
    at = 0 if where == "start" else len(data) // 2
    data[at:at + 64] = bytes(b ^ 0x55 for b in data[at:at + 64])
    file.write_bytes(bytes(data))


def _make_old(step: Path) -> None:
    """``meta.json`` as coursekit wrote it before it recorded the model, precision, run and checksums."""
    meta = json.loads((step / "meta.json").read_text())
    (step / "meta.json").write_text(json.dumps({"step": meta["step"], "layout": meta["layout"], "loss": meta["loss"]}))


# -- what a checkpoint holds -------------------------------------------------------------------------------------

def test_same_size_damage_is_refused_by_its_checksum_naming_the_file_and_the_one_before(saved, tmp_path, capfd):
    folder = _copy(saved, tmp_path)
    shard = sorted((folder / "step-000002").glob("*.distcp"))[-1]
    size = shard.stat().st_size
    _damage(shard)
    assert shard.stat().st_size == size
    before = _tree(folder)
    status, said = _train(capfd, "--checkpoint-dir", str(folder), "--resume", "--steps", "3")
    _refused(status, said, f"{folder / 'step-000002'} is damaged: {shard.name} is not the file that was saved",
             "sha256", "to resume from step-000001, the one before it")
    assert _unchanged_but_new_steps(before, folder) == []


def test_an_old_checkpoint_damaged_inside_gets_dcp_error_as_a_sentence(saved, tmp_path, capfd):
    """No checksums to compare (an older coursekit's checkpoint): DCP meets the damage and raises its
    ``CheckpointException`` on every rank, caught by name."""
    folder = _copy(saved, tmp_path)
    _make_old(folder / "step-000002")
    _damage(sorted((folder / "step-000002").glob("*.distcp"))[0], where="start")
    before = _tree(folder)
    status, said = _train(capfd, "--checkpoint-dir", str(folder), "--resume", "--steps", "3")
    _refused(status, said, f"{folder / 'step-000002'} could not be read (", "resume from step-000001")
    assert _unchanged_but_new_steps(before, folder) == []


def test_a_meta_json_that_lost_its_checksums(saved, tmp_path):
    """A checkpoint that says it records checksums (format 2) and has none is not taken for an older one."""
    folder = _copy(saved, tmp_path)
    meta = json.loads((folder / "step-000002" / "meta.json").read_text())
    del meta["files"]
    (folder / "step-000002" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(checkpoint.CheckpointError, match=r"step-000002 is damaged: its meta.json names no files and "
                                                         r"checksums: move it aside .* to resume from step-000001"):
        checkpoint.verify(folder / "step-000002", {})  # one process, no ranks: verify reads files only


def test_another_number_of_layers(saved, tmp_path, capfd):
    folder = _copy(saved, tmp_path)
    status, said = _train(capfd, "--checkpoint-dir", str(folder), "--resume", "--steps", "3", "--layers", "1")
    _refused(status, said, "step-000002 was saved with layers = 2 and this run has layers = 1",
             "resume with layers = 2")


def test_other_heads_at_the_same_width(saved, tmp_path, capfd):
    """Every tensor has the shape it had: only the recorded model can tell."""
    folder = _copy(saved, tmp_path)
    status, said = _train(capfd, "--checkpoint-dir", str(folder), "--resume", "--steps", "3", "--heads", "4")
    _refused(status, said, "step-000002 was saved with heads = 2 and this run has heads = 4")


def test_an_old_checkpoint_of_more_layers(saved, tmp_path, capfd):
    """No model recorded: the tensors of a layer this run has not say it."""
    folder = _copy(saved, tmp_path)
    _make_old(folder / "step-000002")
    status, said = _train(capfd, "--checkpoint-dir", str(folder), "--resume", "--steps", "3", "--layers", "1")
    _refused(status, said, "step-000002 was saved from another model: it has model.blocks.1.",
             "which this run has not")


def _resumed_in_bf16(folder, capfd, axis: str) -> tuple[str, str]:
    """Resume ``folder``'s checkpoint on 2 ranks along ``axis`` in bf16 to step 3: what rank 0 printed, and its
    "resuming from" line."""
    capfd.readouterr()
    status = main([axis, "2", "--batch", "8", *TINY, "--precision", "bf16", "--checkpoint-dir", str(folder),
                   "--resume", "--steps", "3"])
    said = capfd.readouterr().out
    assert status == 0, said[-3000:]
    return said, next(line for line in said.splitlines() if "resuming from" in line)


def test_an_old_checkpoint_under_another_layout_and_precision_resumes_and_the_log_says_so(saved, tmp_path, capfd):
    folder = _copy(saved, tmp_path)
    _make_old(folder / "step-000002")
    said, line = _resumed_in_bf16(folder, capfd, "--tp")
    assert "it records neither its model nor its files' checksums" in line, line
    assert "the layout differs, dp2 then and tp2 now" in line, line
    assert "step    3/3" in said
    meta = json.loads((folder / "step-000003" / "meta.json").read_text())
    assert meta["precision"] == "bf16" and meta["layout"] == "tp2" and set(meta["files"]) >= {".metadata"}


def test_the_precision_differs_and_the_log_says_so(saved, tmp_path, capfd):
    folder = _copy(saved, tmp_path)
    said, line = _resumed_in_bf16(folder, capfd, "--dp")
    assert "the precision differs, fp32 then and bf16 now" in line and "layout differs" not in line, line
    old = json.loads((folder / "step-000002" / "meta.json").read_text())
    new = json.loads((folder / "step-000003" / "meta.json").read_text())
    assert new["run"] == old["run"], "a resumed run keeps its id"


# -- the directory, before the first step ------------------------------------------------------------------------

def test_a_checkpoint_dir_that_is_a_file(tmp_path, capfd):
    file = tmp_path / "ckpt"
    file.write_text("not a directory")
    capfd.readouterr()
    status = main([*[a for a in COMMON if a != "--quiet"], "--steps", "2", "--checkpoint-dir", str(file)])
    said = "".join(capfd.readouterr())
    _refused(status, said, f"--checkpoint-dir {file} is a file, not a directory")
    assert "step    1/2" not in said, "said before training, not after"
    assert file.read_text() == "not a directory"


@contextmanager
def _read_only(folder: Path):
    """``folder``, read-only for this process: chmod for a user; for root (whom chmod does not stop), a read-only
    tmpfs mounted there; else the test is skipped."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode:
        pytest.skip("root, who writes through chmod, and no mount allowed: no read-only directory to try")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_checkpoint_dir(tmp_path, capfd):
    with _read_only(tmp_path / "ro") as folder:
        status, said = _train(capfd, "--steps", "2", "--checkpoint-dir", str(folder / "ckpt"))
        _refused(status, said, f"--checkpoint-dir {folder / 'ckpt'} cannot be written (",
                 "make it writable or name another directory")
        assert list(folder.iterdir()) == []


def test_not_enough_room_for_one_checkpoint(tmp_path, capfd, monkeypatch):
    """The disk's free room as shutil.disk_usage reports it (patched here, in the ranks too: they are forked)."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=50_000))
    status, said = _train(capfd, "--steps", "2", "--checkpoint-dir", str(tmp_path / "ckpt"))
    sentence = _refused(status, said, f"--checkpoint-dir {tmp_path / 'ckpt'} has 50.0 kB free and one checkpoint "
                                      "of this model takes about")
    parameters = int(re.search(r"\(([\d,]+) parameters", sentence).group(1).replace(",", ""))
    block = 2 * 16 + 48 * 16 + (16 * 16 + 16) + 2 * 16 + (64 * 16 + 64) + (16 * 64 + 16)  # ln1 qkv proj ln2 fc out
    assert parameters == 16 * 16 + 8 * 16 + 2 * block + 2 * 16, "the tiny model's, counted by hand (tok, pos, ln_f)"
    assert not (tmp_path / "ckpt").exists()


# -- a save that fails -------------------------------------------------------------------------------------------

@contextmanager
def _file_size_limit(limit: int):
    """Writes past ``limit`` bytes fail (EFBIG), as on a full disk, for any user: RLIMIT_FSIZE, which the ranks
    forked here inherit, with SIGXFSZ ignored (else it kills the writer); both restored after."""
    old_limit, old_handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_save_past_the_file_size_limit(saved, tmp_path, capfd):
    """The save of step 3 fails on every rank (each shard is over 100 kB): the checkpoints before are kept, the
    run's own torn ``.tmp`` is gone."""
    folder = _copy(saved, tmp_path)
    before = _tree(folder)
    with _file_size_limit(50_000):
        status, said = _train(capfd, "--steps", "3", "--checkpoint-dir", str(folder), "--resume")
    _refused(status, said, f"{folder / 'step-000003'} could not be saved (OSError: [Errno 27] File too large)",
             "then add --resume to go on from step-000002 (kept)")
    assert _unchanged_but_new_steps(before, folder) == []


def test_a_full_disk(tmp_path, capfd):
    """A real full disk: a 500 kB tmpfs passes the check before the first step (one checkpoint, estimated:
    351 kB), holds the first checkpoint (302 kB) and not the second (root only)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=500k", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root (test_a_save_past_the_file_size_limit fails a save for all)")
    try:
        status, said = _train(capfd, "--steps", "2", "--checkpoint-every", "1", "--checkpoint-dir", str(disk))
        _refused(status, said, f"{disk / 'step-000002'} could not be saved (", "No space left on device",
                 "go on from step-000001 (kept)")
        assert sorted(p.name for p in disk.iterdir()) == ["step-000001"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# -- nothing deleted that this run did not write ------------------------------------------------------------------

def test_a_fresh_run_refuses_a_directory_of_another_run(saved, tmp_path, capfd):
    folder = _copy(saved, tmp_path)
    before = _tree(folder)
    status, said = _train(capfd, "--steps", "2", "--checkpoint-dir", str(folder))
    _refused(status, said, f"{folder} holds checkpoints of another run (step-000001, step-000002)",
             "add --resume", "--overwrite to start at step 0 and set them aside")
    assert _tree(folder) == before


def test_overwrite_sets_the_other_runs_checkpoints_aside(saved, tmp_path, capfd):
    folder = _copy(saved, tmp_path)
    before = _tree(folder)
    status, said = _train(capfd, "--steps", "1", "--checkpoint-dir", str(folder), "--overwrite")
    assert status == 0, said[-3000:]
    for name in ("step-000001", "step-000002"):
        aside = list(folder.glob(f"{name}.overwritten-*"))
        assert len(aside) == 1, sorted(p.name for p in folder.iterdir())
        assert _tree(aside[0]) == {k.split("/", 1)[1]: v for k, v in before.items() if k.startswith(f"{name}/")}
    assert checkpoint.latest(folder)[0] == 1, "a later --resume goes on from this run's step 1, not step 2"
    old = json.loads((saved / "step-000001" / "meta.json").read_text())
    assert json.loads((folder / "step-000001" / "meta.json").read_text())["run"] != old["run"]


def test_resume_and_overwrite_together(saved, tmp_path, capfd):
    folder = _copy(saved, tmp_path)
    status, said = _train(capfd, "--steps", "3", "--checkpoint-dir", str(folder), "--resume", "--overwrite")
    _refused(status, said, "resume = True with overwrite = True", "choose one")


def test_a_torn_save_and_an_unfinished_step_are_set_aside_not_removed(saved, tmp_path, capfd):
    """step-000003.tmp (a killed job's) and step-000003 without its marker, each with a file someone put there:
    the save of step 3 renames both aside."""
    folder = _copy(saved, tmp_path)
    for name in ("step-000003.tmp", "step-000003"):
        (folder / name).mkdir()
        (folder / name / "notes.txt").write_text(f"mine, in {name}")
    status, said = _train(capfd, "--steps", "3", "--checkpoint-dir", str(folder), "--resume")
    assert status == 0, said[-3000:]
    aside = sorted(folder.glob("step-000003.incomplete-*"))
    assert len(aside) == 2, f"no step-000003.incomplete-* for both: {sorted(p.name for p in folder.iterdir())}"
    assert sorted((p / "notes.txt").read_text() for p in aside) == ["mine, in step-000003",
                                                                   "mine, in step-000003.tmp"]
    assert checkpoint.latest(folder)[0] == 3


# -- nothing to do -------------------------------------------------------------------------------------------------

def test_resume_with_nothing_left_to_train(saved, tmp_path, capfd):
    """Not an error (status 0: a finished job started again stays finished), but said, even with --quiet."""
    folder = _copy(saved, tmp_path)
    before = _tree(folder)
    status, said = _train(capfd, "--steps", "1", "--checkpoint-dir", str(folder), "--resume")
    assert status == 0, said[-3000:]
    assert f"{folder / 'step-000002'} is already at step 2 of --steps 1: nothing to train; raise --steps to go on." \
        in said, said[-3000:]
    assert "Traceback" not in said
    assert _tree(folder) == before


# -- every rank has the verdict before any leaves ------------------------------------------------------------------

def _late_verdict(rank, world_size):
    if rank == 1:
        time.sleep(1.0)  # rank 1 still building its groups, or checking: rank 0 has refused already
    arrived = time.time()
    try:
        checkpoint_dir.agree("rank 1's sentence" if rank == 1 else None)
    except checkpoint_dir.CheckpointError as error:
        return arrived, time.time(), str(error)
    return arrived, time.time(), None


def test_no_rank_leaves_before_every_rank_has_its_verdict():
    (arrived0, left0, said0), (arrived1, _, said1) = coursekit.launch(_late_verdict, 2, timeout=60)
    assert said0 == said1 == "rank 1's sentence", "every rank raises the same sentence"
    assert left0 >= arrived1, f"rank 0 left {left0 - arrived0:.1f} s after it arrived, before rank 1 arrived"
