"""README's headline numbers are the committed notebooks' own.

README quotes a few figures under "## Headline numbers". Each is read from README and from the output of the
notebook cell that prints it, and the two must be the same string: a chapter re-executed with other numbers
fails here until README says what the notebook now shows (the benchmarks' own numbers live in
docs/benchmarks.md, with their dates). Planted, seen failing: README's tensor-parallel figure set back to the
benchmark's 1.77× while chapter 05 printed 1.69×; chapter 07's output line for the imbalance of 2 deleted.
"""

from __future__ import annotations

import json
import re

import pytest
from readme_support import README, ROOT, text

# (what the figure is; README's sentence, the figure its group; the notebook; its printed line, the figure its group)
HEADLINES = [
    ("warm round trip", r"round trip to 4 running ranks .*?\*\*([\d.]+) ms\*\*", "00_welcome",
     r"^one warm round trip to 4 ranks: ([\d.]+) ms$"),
    ("data parallelism's speed-up", r"data parallelism on 2 ranks trains \*\*([\d.]+)×\*\*", "02_data_parallelism",
     r"^overlapped\s+\d+ ms per step, speed-up over one process ([\d.]+)× \["),
    ("tensor parallelism's speed-up", r"tensor parallelism on 2 ranks runs \*\*([\d.]+)×\*\*", "05_tensor_parallelism",
     r"^tensor parallel\s+\d+ ms\s+([\d.]+)× \["),
    ("a step at imbalance 2", r"a step takes \*\*([\d.]+)×\*\* as long as an even one", "07_expert_parallelism",
     r"^\s*1\.000\s+2\.00\s+([\d.]+)\s+\["),
    ("its prediction", r"near the\s+\*\*([\d.]+)\*\* that rank's load predicts", "07_expert_parallelism",
     r"^\s*1\.000\s+2\.00\s+[\d.]+\s+\[[^\]]*\]\s+([\d.]+)$"),
]


def headline_section() -> str:
    return text(README).split("## Headline numbers", 1)[1].split("\n## ", 1)[0]


def printed(notebook: str) -> str:
    cells = json.loads(text(ROOT / "notebooks" / f"{notebook}.ipynb"))["cells"]
    return "\n".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code" for o in c["outputs"])


def one(pattern: str, where: str, what: str) -> str:
    found = re.findall(pattern, where, re.M)
    assert len(found) == 1, f"{what}: expected one match of {pattern!r}, found {found}"
    return found[0]


@pytest.mark.parametrize("name, said, notebook, shown", HEADLINES, ids=[h[0] for h in HEADLINES])
def test_a_headline_number_is_the_notebooks(name, said, notebook, shown):
    readme = one(said, " ".join(headline_section().split()), f"README's {name}")
    ran = one(shown, printed(notebook), f"{notebook}'s output for {name}")
    assert readme == ran, f"README says {name} is {readme}; notebooks/{notebook}.ipynb printed {ran}: write {ran}"


def test_readme_quotes_no_headline_number_the_test_does_not_read():
    numbers = re.findall(r"\*\*([\d.]+)(?: ms|×)?\*\*", headline_section())
    assert len(numbers) == len(HEADLINES), f"README's headline numbers {numbers}; this test reads {len(HEADLINES)}"
