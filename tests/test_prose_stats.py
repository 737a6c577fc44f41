"""tools/prose_stats.py: what counts as prose, and how sentences and notes are told apart.

Planted bugs, seen failing: fenced code counted as prose; a link counted by its address; a collapsed note counted
in the main text.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import prose_stats  # noqa: E402

PAGE = """# A heading is not prose

One two three (four). Five [six](https://example.com/a/long/address) seven.

```python
code = "is not prose either, however long it gets"
```

| a table | is not |
|---|---|
| prose | either |

![an image](docs/figures/x.png)
<!-- a comment -->

* A bullet is its own sentence
* and so is this one.

<details>
<summary>How it was measured</summary>

Eight nine ten.
</details>
"""


def test_only_prose_counts_and_notes_apart():
    stats = prose_stats.measure(PAGE)
    # main: "One two three (four). Five six seven." (7) + the bullets (6 + 5; their "*" is not a word)
    assert stats.main_words == 18, stats
    assert stats.note_words == 7, stats  # "How it was measured" + "Eight nine ten."
    assert stats.parentheses == 1
    assert stats.sentences == 4, prose_stats.sentences(prose_stats.prose(prose_stats.split_notes(PAGE)[0]))


def test_a_sentence_over_40_words_is_long():
    long = " ".join(["word"] * 41) + ". Short one."
    stats = prose_stats.measure(long)
    assert (stats.sentences, stats.long_sentences) == (2, 1)
