"""The "waiting on" note in shared memory: what the launcher reads is exactly the last note, or nothing.

Planted bugs, each seen failing here: clearing that writes nothing (the stale "send to rank 3, 7
elements" read back after the clear), a note written without its zero byte (the shorter note read back
with the tail of the longer one before it).
"""

import multiprocessing

from coursekit.comm import waiting


def _attached():
    buffer = multiprocessing.get_context("fork").RawArray("c", waiting.STATUS_BYTES)
    waiting.attach(buffer)
    return buffer


def test_each_note_replaces_the_last_and_clearing_leaves_nothing(monkeypatch):
    monkeypatch.setattr(waiting, "_buffer", None)
    buffer = _attached()
    waiting.set_waiting("recv from rank 1, 262144 elements (reduce-scatter step 2)")
    assert waiting.read_note(buffer) == "recv from rank 1, 262144 elements (reduce-scatter step 2)"
    waiting.set_waiting("send to rank 3, 7 elements")
    assert waiting.read_note(buffer) == "send to rank 3, 7 elements"
    waiting.set_waiting("")
    assert waiting.read_note(buffer) == ""
    with waiting.waiting_on("init_process_group"):
        assert waiting.read_note(buffer) == "init_process_group"
    assert waiting.read_note(buffer) == ""


def test_a_long_note_is_cut_to_the_buffer(monkeypatch):
    monkeypatch.setattr(waiting, "_buffer", None)
    buffer = _attached()
    waiting.set_waiting("é" * 400)  # two bytes each: the cut may split one, read back as U+FFFD
    note = waiting.read_note(buffer)
    assert 0 < len(note.encode("utf-8", "replace")) < waiting.STATUS_BYTES + 3 and note.startswith("é" * 100)
