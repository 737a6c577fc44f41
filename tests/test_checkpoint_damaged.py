"""A damaged, partial or foreign checkpoint gets one sentence, exit status 2, no traceback (issue 41, item 3).

One good checkpoint (dp2, after 2 steps) is saved once; each test copies it and damages the copy as a disk, a
copy or a mix-up would, then resumes from it. Before: eight tracebacks in 121 lines (``AssertionError: metadata is
None``), and no line named the checkpoint. Planted bugs, seen failing: no check of the files before DCP reads them
(garbage ``.metadata``: a RankError whose traceback is DCP's; a missing shard: "FileNotFoundError" in a
traceback); the shapes not compared (another model: DCP's "Size mismatch" in a traceback); a step directory
without its marker not mentioned (the skip said nothing).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

import coursekit
from coursekit.capstone import Config, run
from coursekit.capstone import checkpoint
from coursekit.capstone.__main__ import main

COMMON = ["--dp", "2", "--batch", "8", "--steps", "4", "--quiet"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A complete checkpoint after 2 steps of dp2: the folder holding ``step-000002``."""
    folder = tmp_path_factory.mktemp("good")
    config = Config(dp=2, batch=8, steps=2, quiet=True, checkpoint_dir=str(folder))
    coursekit.launch(run, 2, config, timeout=120)
    assert checkpoint.latest(folder)[0] == 2
    return folder


def _copy(saved, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(saved, folder)
    return folder, folder / "step-000002"


def _resume(folder, capfd, *extra) -> tuple[int, str]:
    capfd.readouterr()
    status = main([*COMMON, "--checkpoint-dir", str(folder), "--resume", *extra])
    out, err = capfd.readouterr()
    return status, out + err


def _one_sentence(said: str, *phrases: str) -> None:
    assert "Traceback" not in said, said[-3000:]
    lines = [line for line in said.splitlines() if "coursekit train:" in line]
    assert len(lines) == 1, said[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def test_garbage_metadata(saved, tmp_path, capfd):
    folder, step = _copy(saved, tmp_path)
    (step / ".metadata").write_bytes(b"\x00not a pickle\xff" * 8)
    status, said = _resume(folder, capfd)
    assert status == 2
    _one_sentence(said, f"{step} is damaged: its .metadata is not a torch.distributed.checkpoint index",
                  "there is no complete checkpoint before it: start at step 0 with --overwrite instead of --resume")


def test_a_missing_shard(saved, tmp_path, capfd):
    folder, step = _copy(saved, tmp_path)
    shard = sorted(step.glob("*.distcp"))[-1]
    shard.unlink()
    status, said = _resume(folder, capfd)
    assert status == 2
    _one_sentence(said, f"{step} is incomplete: {shard.name} is missing")


def test_a_truncated_shard(saved, tmp_path, capfd):
    folder, step = _copy(saved, tmp_path)
    shard = sorted(step.glob("*.distcp"))[0]
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:size // 2])
    status, said = _resume(folder, capfd)
    assert status == 2
    _one_sentence(said, f"{step} is damaged: {shard.name} holds {size // 2:,} bytes", "(a truncated file)")


def test_a_checkpoint_of_another_model(saved, tmp_path, capfd):
    """meta.json records the model (issue 60): the first setting that differs is named."""
    folder, step = _copy(saved, tmp_path)
    status, said = _resume(folder, capfd, "--d-model", "32", "--heads", "2")
    assert status == 2
    _one_sentence(said, f"{step} was saved with d_model = 64 and this run has d_model = 32")


def test_an_older_checkpoint_of_another_model(saved, tmp_path, capfd):
    """A meta.json without the model (an older coursekit's): the shapes say it."""
    folder, step = _copy(saved, tmp_path)
    meta = json.loads((step / "meta.json").read_text())
    (step / "meta.json").write_text(json.dumps({"step": meta["step"], "layout": meta["layout"]}))
    status, said = _resume(folder, capfd, "--d-model", "32", "--heads", "2")
    assert status == 2
    _one_sentence(said, f"{step} was saved from another model:", "there and", "in this run")


def test_a_step_directory_without_its_marker_is_passed_over(saved, tmp_path, capfd):
    """step-000004 holds DCP's files but not meta.json (copied in part): the run resumes from step 2 and says so."""
    folder, step = _copy(saved, tmp_path)
    later = folder / "step-000004"
    shutil.copytree(step, later)
    (later / "meta.json").unlink()
    capfd.readouterr()
    resumed = coursekit.launch(run, 2, Config(dp=2, batch=8, steps=4, checkpoint_dir=str(folder), resume=True),
                               timeout=120)[0]
    said = capfd.readouterr().out
    assert resumed["first_step"] == 2, resumed
    assert f"ignoring {later}: not a complete checkpoint" in said and "resuming from" in said, said


def test_under_torchrun_the_same_sentence_and_status_2(saved, tmp_path):
    """The torchrun path: every rank says the sentence and exits 2; torchrun reports the job failed (its own
    traceback), but no frame of ours. Planted, seen failing: _torchrun ignoring the refusal (status 0).

    Under load it once failed here: rank 0 refused and left while rank 1 was still building a group with it
    (rank 1: "Gloo connectFullMesh failed ... Connection closed by peer", a traceback), and torchrun, stopping
    the job at rank 0's exit, could kill rank 1 before it said anything. Now the ranks agree on the verdict
    (checkpoint_dir.agree) and each says it before any leaves (a barrier): both ranks' lines are required."""
    from test_capstone import TORCHRUN, _finish, _job

    folder, step = _copy(saved, tmp_path)
    (step / ".metadata").write_bytes(b"garbage")
    rc, _, err = _finish(_job(TORCHRUN + ["--standalone", "--nproc-per-node", "2", "-m", "coursekit.capstone",
                                          *COMMON, "--checkpoint-dir", str(folder), "--resume"]), 120)
    assert rc != 0, err[-2000:]
    for rank in (0, 1):
        assert f"(rank {rank}): {step} is damaged: its .metadata" in err, err[-3000:]
    assert not re.search(r'File ".*coursekit/', err), err[-3000:]
