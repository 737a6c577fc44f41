"""tools/execute_notebooks.py never overwrites a notebook it should not, and replaces atomically."""

import errno
import importlib.util
import os
import subprocess
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "tools" / "execute_notebooks.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


@pytest.fixture
def fake_papermill(monkeypatch):
    """Instead of running a kernel, write an 'executed' copy and remember where it went."""
    import papermill

    written = []

    def execute_notebook(src, out, **kwargs):
        nb = nbformat.read(src, as_version=4)
        nb.metadata["executed"] = True
        nbformat.write(nb, out)
        written.append(Path(out))

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    return written


def _notebook(folder: Path) -> Path:
    path = folder / "lesson.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('learner work')")])
    nbformat.write(nb, path)
    return path


def _git(folder: Path, *args):
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_a_notebook_outside_a_git_checkout_is_never_overwritten(tmp_path, fake_papermill, capsys):
    """Planted bug: git fails (not a checkout), its empty output reads as 'not edited', the notebook is overwritten."""
    path = _notebook(tmp_path)
    before = path.read_bytes()
    assert tool.main([str(path)]) == 1
    assert path.read_bytes() == before and not fake_papermill
    assert "git cannot tell" in capsys.readouterr().out


def test_only_a_clean_committed_notebook_is_executed(tmp_path, fake_papermill, capsys):
    path = _notebook(tmp_path)
    _git(tmp_path, "init", "-q")
    assert tool.main([str(path)]) == 1 and not fake_papermill  # never committed: the learner's own
    _git(tmp_path, "add", path.name)
    _git(tmp_path, "commit", "-qm", "lesson")
    path.write_text(path.read_text().replace("learner work", "edited"))
    assert tool.main([str(path)]) == 1 and not fake_papermill  # edited since the commit
    assert "uncommitted edits" in capsys.readouterr().out
    _git(tmp_path, "checkout", "-q", "--", path.name)
    assert tool.main([str(path)]) == 0
    assert nbformat.read(path, as_version=4).metadata["executed"] is True


def test_the_result_is_written_next_to_the_notebook_and_renamed_atomically(tmp_path, fake_papermill, monkeypatch):
    """Planted bug: the run goes to a temporary folder elsewhere and Path.replace fails across filesystems (EXDEV)."""
    path = _notebook(tmp_path)
    real_replace = os.replace

    def replace_same_filesystem_only(src, dst):  # as if every other folder were another filesystem
        if Path(src).resolve().parent != Path(dst).resolve().parent:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_same_filesystem_only)
    monkeypatch.setattr(Path, "replace", lambda self, target: replace_same_filesystem_only(self, target))
    tool.execute(path)
    assert fake_papermill[0].parent == tmp_path
    assert nbformat.read(path, as_version=4).metadata["executed"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lesson.ipynb"]  # no temporary file left behind


def test_a_failed_run_leaves_the_notebook_and_no_temporary_file(tmp_path, monkeypatch):
    import papermill

    path = _notebook(tmp_path)
    before = path.read_bytes()

    def fails(src, out, **kwargs):
        Path(out).write_text("half written")
        raise RuntimeError("a cell failed")

    monkeypatch.setattr(papermill, "execute_notebook", fails)
    with pytest.raises(RuntimeError, match="a cell failed"):
        tool.execute(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["lesson.ipynb"]


def test_readme_figures_are_exported_again_only_after_their_notebook_ran(monkeypatch, tmp_path):
    """Planted bug: no export after a run, and README's figure of notebook 04 shows the run before it."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import export_figures

    exports = []
    monkeypatch.setattr(export_figures, "export", lambda root: exports.append(root) or [])
    tool.export_readme_figures([_notebook(tmp_path)])
    assert exports == [], "a notebook no figure comes from must not export anything"
    tool.export_readme_figures([ROOT / "notebooks" / "04_pipeline_parallelism.ipynb"])
    assert exports == [ROOT], "after notebook 04 ran, README's figures must be exported again"
