"""Facts a chapter states in words, checked against what it printed and against the sources it names (issue 56 §2).

Each test reads the sentence from the committed notebook and the number it must agree with from an independent
place: the chapter's own printed output, a count made here on the simulator, or the installed PyTorch's own
documentation. Planted bugs, each seen failing, are in the tests' docstrings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}


def cells(chapter: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text(encoding="utf-8"))["cells"]


def prose(chapter: str) -> str:
    """The chapter's markdown, lines joined by spaces (a sentence may wrap)."""
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells(chapter) if c["cell_type"] == "markdown")


def printed(chapter: str) -> str:
    return "\n".join("".join(o.get("text", "")) for c in cells(chapter) if c["cell_type"] == "code"
                     for o in c["outputs"])


# ------------------------------------------------------------------------------------------------ chapter 06
def test_06_says_how_many_all_gathers_backward_adds_and_the_simulator_counts_them():
    """Megatron-style sequence parallelism: backward's collectives are forward's transposed (an all-gather for each
    reduce-scatter), plus the re-gathers of the column-parallel layers' inputs. Counted per block on the simulator
    at t = 2 and 4. Planted, seen failing: the old sentence "Backward adds one all-gather per block"."""
    from coursekit import comm
    from coursekit.models import tiny_transformer
    from coursekit.parallel.sequence import SequenceTensorParallelBlock, shard_sequence

    said = re.search(r"Backward adds (\w+) all-gathers? per block", prose("06_sequence_parallelism"))
    assert said, "chapter 06 no longer says how many all-gathers backward adds"
    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(0))
    for t in (2, 4):
        def one_block(rank, size):
            block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0])
            block(shard_sequence(x, 1, rank, size).requires_grad_()).sum().backward()

        sent = [m for m in comm.simulate(one_block, t).traffic.payload if m.src == 0]
        calls = {}  # one collective = one message from rank 0 to each of the t - 1 others
        for m in sent:
            kind = ("backward" if "backward" in m.phase else "forward", "gather" if "gather" in m.phase else "scatter")
            calls[kind] = calls.get(kind, 0) + 1 / (t - 1)
        added = calls[("backward", "gather")] - calls[("forward", "scatter")]
        assert WORDS[said.group(1)] == added, f"t={t}: chapter 06 says {said.group(1)}; backward adds {added:g}"


# ------------------------------------------------------------------------------------------------ chapter 08
GPT3 = dict(s=2048, b=1, h=12288, a=96)      # GPT-3 175B (Brown et al. 2020), the shape chapter 08 prices


def evaluate(formula: str, **values: float) -> float:
    """'sbh(10 + 24/t + 5as/(ht))' as written in the text, with implicit products made explicit."""
    python = re.sub(r"(?<=[\w)])(?=[a-z(])", "*", formula.replace(" ", ""))
    return eval(python, {"__builtins__": {}}, values)  # noqa: S307 - a formula of single letters and digits


def test_08_activation_formulas_as_written_give_the_printed_bytes_at_t_2_and_8():
    """The text states Table 2's formulas; each is evaluated here and compared with the rows printed below it.
    Planted, seen failing: the old wording, tensor parallelism dividing only the 24 (sbh(10 + 24/t + 5as/h):
    102 · sbh at t = 2, where the chapter prints 62)."""
    text = prose("08_choosing_a_strategy")
    formulas = re.findall(r"sbh\((?:[^()]|\([^()]*\))*\)", text.split("Take a micro-batch", 1)[1])
    dense, tensor = formulas[0], formulas[1]
    assert "t" not in dense and "t" in tensor, (dense, tensor)
    rows = {label: numbers for label, *numbers in re.findall(r"^(no parallelism|tp \d+)\s+([\d.]+) · sbh = +([\d.]+) "
                                                              r"MiB a layer$", printed("08_choosing_a_strategy"), re.M)}
    sbh = GPT3["s"] * GPT3["b"] * GPT3["h"]
    expected = {"no parallelism": evaluate(dense, **GPT3)} | {f"tp {t}": evaluate(tensor, t=t, **GPT3) for t in (2, 8)}
    for label, value in expected.items():
        assert label in rows, f"chapter 08 prints no row {label!r}"
        assert float(rows[label][0]) == round(value / sbh, 2) and float(rows[label][1]) == round(value / 2**20, 1), \
            f"{label}: the text's formula gives {value / sbh:.2f} · sbh, the chapter prints {rows[label][0]}"


def test_08_the_embedding_mistake_on_llama_is_the_factor_the_text_says():
    """Counting the embedding's lookup as a v×h matmul adds 6·v·h FLOPs a token to the printed FLOPs a token of
    Llama 3.1 8B (vocabulary 128,256, hidden 4,096: Meta's model card). Planted, seen failing: 'about 1.27',
    GPT-2 small's factor, said of Llama."""
    said = re.search(r"Llama 3\.1 8B's vocabulary matrix .*? gives about (\d+\.\d+)", prose("08_choosing_a_strategy"))
    assert said, "chapter 08 no longer says what the embedding mistake gives for Llama 3.1 8B"
    gflop = float(re.search(r"Llama 3\.1 8B, 8 H100s: ([\d.]+) GFLOP a token", printed("08_choosing_a_strategy"))[1])
    factor = 1 + 6 * 128_256 * 4_096 / (gflop * 1e9)
    assert said.group(1) == f"{factor:.2f}", f"chapter 08 says about {said.group(1)}; it is {factor:.2f}"


# ------------------------------------------------------------------------------------------------ chapter 09
def test_09_states_the_default_timeouts_torch_documents():
    """gloo's default is printed by the chapter (torch.distributed.constants.default_pg_timeout); NCCL's is in
    init_process_group's documentation: "Default value is 10 minutes for NCCL and 30 minutes for other backends"
    (PyTorch PR 110947 changed NCCL's). Planted, seen failing: 'a real job's default is 30 minutes' alone."""
    import torch.distributed as dist

    documented = re.search(r"Default value is (\d+) minutes for NCCL and (\d+) minutes for other backends",
                           " ".join(dist.init_process_group.__doc__.split()))
    assert documented, "this torch's init_process_group no longer documents its default timeouts"
    nccl, other = documented.groups()
    assert f"gloo's default timeout: 0:{int(other):02d}:00" in printed("09_debugging")
    text = prose("09_debugging")
    assert f"A real job's default is {other} minutes on gloo and {nccl} minutes on NCCL" in text
    assert f"NCCL's default is {nccl} minutes" in text


# ------------------------------------------------------------------------------------------------ chapter 07
def test_07_capacity_rounds_up_and_is_counted_on_each_ranks_tokens():
    """The text and the glossary say C = ⌈factor · k · T / E⌉ with T one rank's tokens under expert parallelism.
    Checked on the course's layer: 10 tokens a rank all routed to expert 0 of 4 at factor 1, k = 1, so
    C = ⌈2.5⌉ = 3 from each of 2 ranks: expert 0's rank receives 6 rows. Planted, seen failing: math.floor in
    keep_within_capacity (2 kept); the text's old 'at most C = factor · k · T / E'."""
    from coursekit import comm
    from coursekit.parallel.expert import ExpertParallelMoE, MoE

    text = prose("07_expert_parallelism")
    assert "C = ⌈factor · k · T / E⌉" in text and "T is one rank's tokens" in text
    glossary = " ".join((ROOT / "docs" / "glossary.md").read_text(encoding="utf-8").split())
    assert "⌈factor · k · T / E⌉" in glossary and "each rank counts its own capacity" in glossary

    def received(rank, size):
        moe = MoE(8, 16, n_experts=4, k=1, capacity_factor=1.0, seed=0)
        moe.router.bias.copy_(torch.tensor([5.0, 0.0, 0.0, 0.0]))  # the routing bias: every token chooses expert 0
        layer = ExpertParallelMoE(moe, None)
        seen = []
        layer.experts.register_forward_pre_hook(lambda module, args: seen.append(list(args[1])))
        layer(torch.randn(10, 8, generator=torch.Generator().manual_seed(rank)))
        return seen[0]

    per_expert = comm.simulate(received, 2).results
    assert per_expert[0][0] == 2 * 3, f"expert 0 received {per_expert[0][0]} rows; C = 3 from each of 2 ranks is 6"


def test_07_names_torchtitans_default_router_as_the_installed_torchtitan_has_it():
    """torchtitan's router defaults to DeepSeek-V3's sigmoid scores (``score_func``), read from the installed
    package's source. Planted, seen failing: the old 'Its router is ours: softmax, top-k, ...'."""
    import importlib.util

    source = (Path(importlib.util.find_spec("torchtitan").origin).parent / "models" / "common" / "moe.py").read_text()
    default = re.search(r'score_func: Literal\["softmax", "sigmoid"\] = "(\w+)"', source).group(1)
    text = prose("07_expert_parallelism")
    assert f'Its default is DeepSeek-V3\'s router instead (`score_func="{default}"`)' in text
    assert "Each expert's score is a sigmoid of its own logit" in text and "divided by their sum" in text
