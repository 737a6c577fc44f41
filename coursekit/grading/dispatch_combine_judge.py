"""Exercise 07's judgments of one run (:class:`~.dispatch_combine_runs.Run`): each returns None (right) or a
sentence naming the mistake, in words a learner can act on.

* :func:`rows_mistake`: what one rank's dispatch returned against what its experts must get;
* :func:`output_mistake`: each token's output against the one-process MoE;
* :func:`gradient_mistake`: the gradients of x, the router and the experts;
* :func:`traffic_mistake`: every message, link by link, against what the routing says must move.

Each judges only what the one before it found right: a wrong output's traffic is not judged.
"""

from __future__ import annotations

import torch

from .scoring import NotDone

__all__ = ["capacity_misread", "rows_mistake", "output_mistake", "gradient_mistake", "traffic_mistake", "COMBINE_NOT_DONE"]

COMBINE_NOT_DONE = "combine: not implemented yet (NotImplementedError)"
LAYOUT = "rank r holds experts r·E/ep … (r+1)·E/ep − 1, so expert e lives on rank e // (E/ep)"
BY_SENDER = ("they are still grouped by sender (rank 0's rows, then rank 1's, …), as the all-to-all delivered "
             "them; Experts.forward takes all rows of local expert 0 first, then all of expert 1, …: regroup them "
             "by expert (and keep that order in plan, for combine to undo)")
GATES = ("the outputs are the experts' outputs summed without their gates: multiply each row by its "
         "gate before adding it into its token's row")
NO_HISTORY = ("a row received with comm.irecv, exchange or a copy into a new buffer has no autograd history: send "
              "the rows with all_to_all both ways, whose backward is the reverse all-to-all")
GATES_TWICE = ("each row is multiplied by its gate twice (the outputs are the gate-squared sum): weight each row "
               "by its gate once, in combine")
ONE_RANK_WRONG = ("with one rank nothing travels and nothing is regrouped, so combine is wrong: add each row of y "
                  "times its gate into its token's row")
COMBINE_WRONG = ("Every rank's dispatch is right (see dispatch_rows), so combine is wrong: undo dispatch's regrouping "
                 "(y is in your experts' order; the all-to-all back needs the order the rows arrived in), send each "
                 "row back to its sender, and add it times its gate into its token's row")
GATES_STAY = ("a token's gates stay on its own rank: combine multiplies each row that comes back by its "
              "gate there, so nothing but the rows travels to the experts")
CAPACITY = {
    "not_applied": ("the capacity was not applied: with capacity factor {factor:g} an expert takes at most "
                    "C = ⌈{factor:g}·k·T/E⌉ of a rank's assignments; drop the rest before sending the rows"),
    "rounded_down": ("the capacity was rounded down: C = ⌈factor·k·T/E⌉ rounds up (an expert takes one more row "
                     "when factor·k·T/E is not whole)"),
    "over_the_world": ("the capacity was counted on the tokens of every rank: each rank counts it on its own T "
                       "tokens (T = x.shape[0]), as the one-process MoE does on each rank's batch"),
    "token_order": ("the right number of rows, but the wrong ones dropped: an expert keeps first choices before "
                    "second choices (every token's first choice, in token order, then every second choice), and "
                    "drops the rest"),
}
COUNTS = ("counts are bookkeeping, not rows: exchange them inside `with comm.control():`, so that they are counted "
          "as control traffic")


def _close(got, want) -> bool:
    if got is None or want is None or got.shape != want.shape:
        return False
    if want.numel() == 0:
        return True
    return bool((got - want).abs().max() <= 1e-9 * (1 + want.abs().max()))  # NaN is never close


def _multiset(rows: torch.Tensor) -> list:
    return sorted(map(tuple, rows.tolist()))


def _same_rows(got: torch.Tensor, want: torch.Tensor) -> bool:
    """The same rows, in any order."""
    return got.shape == want.shape and _multiset(got) == _multiset(want)


def rows_mistake(run, rank: int) -> str | None:
    """Rank ``rank``'s dispatch: the rows of its experts' assignments, grouped by expert, and their counts."""
    case, ref, got = run.case, run.ref, run.ranks[rank]
    rows, per, where = got["rows"], got["per"], f"rank {rank}"
    want_per = ref.per[rank]
    if rows.dim() != 2 or rows.shape[1] != case.d:
        return f"{where}'s rows have shape {tuple(rows.shape)}, not (n, d = {case.d}): one row per assignment"
    if len(per) != case.local:
        return (f"{where} returned {len(per)} counts in rows_per_local_expert, not one per local expert "
                f"(E/ep = {case.n_experts}/{case.ep} = {case.local})")
    if sum(per) != rows.shape[0]:
        return f"{where}'s rows_per_local_expert {per} adds up to {sum(per)}, but it returned {rows.shape[0]} rows"
    everything = torch.cat(ref.arrivals[rank])
    if per == want_per and all(_same_rows(p, w) for p, w in zip(rows.split(per), ref.arrivals[rank])):
        return None
    if case.local > 1 and _same_rows(rows, ref.wrong_owner[rank]) and not _same_rows(rows, everything):
        return (f"{where} received the rows of experts {[e * case.ep + rank for e in range(case.local)]}, as if "
                f"expert e lived on rank e % ep; {LAYOUT}")
    if _same_rows(rows, everything):
        if per != want_per:
            return (f"{where} received the right rows, but its rows_per_local_expert is {per}: its experts get "
                    f"{want_per} rows (what every rank sends each of them: the counts you received)")
        said = f"{where} received the right rows, but not grouped by expert"
        pieces = ref.by_sender[rank]
        if all(map(_same_rows, rows.split([len(p) for p in pieces]), pieces)):  # each sender's, in any order
            return f"{said}: {BY_SENDER}"
        return f"{said}: its first {per[0]} rows should all be local expert 0's, then come local expert 1's, …"
    misread = capacity_misread(run, rank)
    if misread:
        return f"{where}'s experts got {per} rows, where they take {want_per}: {misread}"
    if rows.shape[0] > everything.shape[0]:
        return (f"{where} received {rows.shape[0]} rows, but only {everything.shape[0]} assignments go to its "
                f"experts: send each token's row only to the rank of the expert it was assigned to, once per "
                f"assignment")
    return (f"{where}'s experts should get {want_per} rows (their assignments from every rank); it returned "
            f"{per}, and {'the wrong rows' if rows.shape[0] == everything.shape[0] else 'too few rows'}")


def capacity_misread(run, rank: int) -> str | None:
    """What rank ``rank``'s rows say of the capacity rule its dispatch applied, if they are what a misread rule
    keeps (:data:`~.dispatch_combine_runs.MISREAD`); None otherwise."""
    per, rows = run.ranks[rank]["per"], run.ranks[rank]["rows"]
    said = [CAPACITY[name].format(factor=run.case.factor) for name, arrivals in run.ref.misread.items()
            if per == [len(a) for a in arrivals[rank]] and all(map(_same_rows, rows.split(per), arrivals[rank]))]
    return "; or ".join(said) or None  # two rules may keep the same rows here: both are named


def output_mistake(run) -> str | None:
    """Each rank's output, token by token, against the one-process MoE's."""
    if not run.combined:
        raise NotDone(COMBINE_NOT_DONE)
    wrong_rows = next(filter(None, (rows_mistake(run, rank) for rank in range(run.case.ep))), None)
    for rank, got in enumerate(run.ranks):
        want, out = run.ref.outs[rank], got["out"]
        if out is None:
            return f"{wrong_rows}: the experts could not run on what dispatch returned (fix dispatch first)"
        if out.shape != want.shape:
            return f"rank {rank}'s combine returned shape {tuple(out.shape)}, not (tokens, d) = {tuple(want.shape)}"
        if _close(out, want):
            continue
        if wrong_rows:
            return f"dispatch is wrong (see dispatch_rows), so the outputs are too: {wrong_rows}"
        if _close(out, run.ref.ungated[rank]):
            return f"rank {rank}: {GATES}"
        if _close(out, run.ref.twice[rank]):
            return f"rank {rank}: {GATES_TWICE}"
        off = (out - want).abs().amax(1).nan_to_num(float("inf"))
        bad = [t for t in range(len(off)) if not off[t] <= 1e-9 * (1 + want.abs().max())]
        return (f"rank {rank}: token {bad[0]}'s output differs from the one-process MoE by {off[bad[0]]:.3g} "
                f"({len(bad)} of {len(off)} tokens differ). {ONE_RANK_WRONG if run.case.ep == 1 else COMBINE_WRONG}")
    return None


def gradient_mistake(run) -> str | None:
    """The gradients of x (each rank's), of the router (summed over the ranks) and of each rank's experts."""
    if output_mistake(run):
        return "the outputs differ (see outputs_equal_one_process), so their gradients cannot match"
    ref, ranks, local = run.ref, run.ranks, run.case.local
    for rank, got in enumerate(ranks):
        if got["w1_grad"] is None and got["rows"].shape[0] > 0:
            return (f"no gradient reached rank {rank}'s experts, though they ran on {got['rows'].shape[0]} rows: "
                    f"in autograd's eyes the output does not depend on their outputs. {NO_HISTORY}")
    if all(got["router_grad"] is None for got in ranks):
        return ("no gradient reached the router on any rank. Its only path to the loss is the gates: multiply by "
                "the gates themselves, not detached copies")
    for rank, got in enumerate(ranks):  # the experts' first: a wrong way back (combine) shows there
        mine = slice(rank * local, (rank + 1) * local)
        for name, want in (("w1", ref.w1_grad[mine]), ("w2", ref.w2_grad[mine])):
            if not _close(got[f"{name}_grad"], want):
                return (f"rank {rank}'s experts' gradient of {name} differs from the one-process MoE's: the gradient "
                        f"of their outputs must come back from every rank whose tokens they ran on, through "
                        f"combine's way back. {NO_HISTORY}")
    for rank, got in enumerate(ranks):
        if not _close(got["x_grad"], ref.x_grads[rank]):
            said = "none" if got["x_grad"] is None else "it differs"
            return (f"rank {rank}'s gradient of x is not the one-process MoE's ({said}): each row's gradient must "
                    f"come back to its token, through dispatch's way there. {NO_HISTORY}")
    router = sum(got["router_grad"] for got in ranks if got["router_grad"] is not None)
    if not _close(router, ref.router_grad):
        return "the router's gradient (summed over the ranks) differs from the one-process MoE's"
    return None


def _totals(sent) -> dict:
    """(stage, kind, floating, src, dst) -> bytes sent; only non-empty messages."""
    totals: dict = {}
    for s in sent:
        if s.numel:
            key = (s.stage, s.kind, s.floating, s.src, s.dst)
            totals[key] = totals.get(key, 0) + s.nbytes
    return totals


def _control_numbers(sent) -> dict:
    """(stage, src, dst) -> numbers sent as control traffic (any dtype)."""
    numbers: dict = {}
    for s in sent:
        if s.kind == "control" and s.numel:
            numbers[(s.stage, s.src, s.dst)] = numbers.get((s.stage, s.src, s.dst), 0) + s.numel
    return numbers


def traffic_mistake(run) -> str | None:
    """Link by link: each way, exactly the rows the routing sends there (× d × 8 bytes), as payload; control
    traffic only for the counts: at most E numbers from one rank to another, whatever their dtype."""
    if gradient_mistake(run):
        return "the outputs or gradients are wrong (see the checks above): traffic is judged only for a right answer"
    case, counts, totals = run.case, run.ref.counts, _totals(run.sent)
    # Control traffic is judged by how much is sent (at most E numbers, the counts), not by its dtype: counts may
    # travel as floats. Its dtype only picks the words: floats beyond the counts are rows, said first.
    too_much = {key: n for key, n in _control_numbers(run.sent).items() if n > case.n_experts}
    for (stage, i, j), numbers in sorted(too_much.items(), key=str):
        if any(k[0] == stage and k[1] == "control" and k[2] and k[3:] == (i, j) for k in totals):
            return (f"in {stage} rank {i} sent rank {j} {numbers} numbers as control traffic, more than the "
                    f"E = {case.n_experts} counts one rank can owe another: only the counts are control; the rows "
                    f"are payload (the method's cost), so send them outside comm.control()")
    links = [(i, j) for i in range(case.ep) for j in range(case.ep) if i != j]
    for stage, want in (("dispatch", lambda i, j: counts[i][j]), ("combine", lambda i, j: counts[j][i]),
                        ("backward", lambda i, j: counts[i][j] + counts[j][i])):
        for i, j in links:
            got = totals.get((stage, "payload", True, i, j), 0)
            if got != want(i, j) * case.d * 8:
                return _link_mistake(run, stage, i, j, got, want(i, j))
    for (stage, i, j), numbers in sorted(too_much.items(), key=str):
        return (f"in {stage} rank {i} sent rank {j} {numbers} numbers as control traffic, more than the "
                f"E = {case.n_experts} counts one rank can owe another: exchange only the counts (each rank's rows "
                f"for each expert); nothing else of the routing needs to travel")
    for (stage, kind, floating, i, j), nbytes in sorted(totals.items(), key=str):
        if kind == "payload" and not floating:
            return f"in {stage} rank {i} sent rank {j} {nbytes // 8} integers as payload (the counts?): {COUNTS}"
    return None


def _link_mistake(run, stage: str, i: int, j: int, got: int, want: int) -> str:
    case, row = run.case, run.case.d * 8
    said = (f"in {stage} rank {i} sent rank {j} {got:,} bytes of rows ({got / row:g} rows of d = {case.d} "
            f"float64), but the routing moves {want} row{'' if want == 1 else 's'} ({want * row:,} bytes) there")
    if stage == "dispatch" and got == case.sizes[i] * row != want * row:
        return (f"{said}: it sent every one of its {case.sizes[i]} tokens. Sending every token to every rank is an "
                f"all-gather, ep times the traffic: send each row only to the rank that holds its expert")
    extra = got - want * row
    if extra > 0 and stage == "dispatch" and extra == want * 8:
        return (f"{said}: one extra number per row rides along ({want}), the gates?: {GATES_STAY}")
    if 0 < extra < row:
        return f"{said}: {extra // 8} extra numbers ride with the rows (the counts?): {COUNTS}"
    return (f"{said}: send each row once, to the rank of its expert, and nothing else (no padding, no copies): an "
            f"uneven all-to-all moves exactly the rows the routing assigns")
