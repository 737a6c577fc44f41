"""Pipeline schedules as data: generators, validator, unit-time plan, the papers' formulas, torch's order.

Expected values come from the papers (bubble, peak activations) or are written
by hand from the schedule's definition; none is copied from the code's output.
Each test names, in its docstring, the bug planted by hand to see it fail.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from fractions import Fraction
from types import SimpleNamespace

import pytest

from coursekit.parallel.pipeline import (SCHEDULES, Action, Schedule, ScheduleError, add_communication,
                                         bubble_formula, gpipe, interleaved_1f1b, make_schedule, one_f_one_b,
                                         peak_activations_formula, plan, validate, zb_h1)

P_RANGE, M_RANGE = range(1, 7), range(1, 9)


@functools.cache
def all_schedules() -> list[tuple[str, int, int, int, Schedule]]:
    """Every (name, p, m, v) the generators accept for p <= 6, m <= 8, v <= 3."""
    found = []
    for name in SCHEDULES:
        for p in P_RANGE:
            for m in M_RANGE:
                for v in ((1, 2, 3) if name == "interleaved" else (1,)):
                    try:
                        found.append((name, p, m, v, make_schedule(name, p, m, v)))
                    except ValueError:
                        continue
    return found


@functools.cache
def planned(name: str, p: int, m: int, v: int):
    return plan(make_schedule(name, p, m, v))


def test_every_generated_schedule_validates_and_covers_the_cases_asked_for():
    """Planted bug: add_communication sending no gradient from stage 1 (``a.stage > 1``): ScheduleError."""
    seen = set()
    for name, p, m, v, schedule in all_schedules():
        validate(schedule)
        seen.add((name, p, m, v))
    for name in ("gpipe", "1f1b"):  # every size, m < p and m not divisible by p included
        assert {(p, m) for p in P_RANGE for m in M_RANGE} <= {(p, m) for n, p, m, _ in seen if n == name}
    assert ("interleaved", 4, 6, 2) in seen and ("interleaved", 2, 5, 2) not in seen  # torch's rounds rule
    assert ("zb_h1", 3, 5, 1) in seen and ("zb_h1", 4, 3, 1) not in seen


def test_1f1b_by_hand_p2_m3():
    """Written from the definition (1 warm-up forward on rank 0, none on rank 1; SEND after, RECV before).
    Planted bug: warm-up p−r instead of p−1−r: rank 1 starts 'RECV_F0@s1 F0@s1 RECV_F1@s1' not '... B0@s1'."""
    s = one_f_one_b(2, 3)
    assert [str(a) for a in s.actions[0]] == ["F0@s0", "SEND_F0@s0", "F1@s0", "SEND_F1@s0", "RECV_B0@s0", "B0@s0",
                                              "F2@s0", "SEND_F2@s0", "RECV_B1@s0", "B1@s0", "RECV_B2@s0", "B2@s0"]
    assert [str(a) for a in s.actions[1]] == ["RECV_F0@s1", "F0@s1", "B0@s1", "SEND_B0@s1", "RECV_F1@s1", "F1@s1",
                                              "B1@s1", "SEND_B1@s1", "RECV_F2@s1", "F2@s1", "B2@s1", "SEND_B2@s1"]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_planned_bubble_equals_the_papers_formula(name):
    """Planted bugs, each seen failing: ZB-H1 with W right after every B (``k >= 0``): 'zb_h1 p=2 m=2 v=1: 1/4 !=
    1/7'; interleaved backward chunks in forward order (``reverse=False``)."""
    for n, p, m, v, schedule in all_schedules():
        if n == name:
            got, want = planned(name, p, m, v).bubble_fraction, bubble_formula(name, p, m, v)
            assert isinstance(got, Fraction) and got == want, f"{name} p={p} m={m} v={v}: {got} != {want}"


@pytest.mark.parametrize("times", [{"F": 1, "B": 2, "W": 1}, {"F": 3, "B": 2, "W": 2}, {"F": 2, "B": 3, "W": 1}])
def test_bubble_with_other_times(times):
    """GPipe/1F1B for any times; ZB-H1 whenever T_W <= min(T_F, T_B). Planted bug: plan ignoring ``times``
    (default units): ZB-H1 '(2, 2): 1/7 == 1/5' (GPipe's and 1F1B's fractions do not depend on the times)."""
    for name in ("gpipe", "1f1b"):
        for p in P_RANGE:
            for m in M_RANGE:
                assert plan(make_schedule(name, p, m), times).bubble_fraction == bubble_formula(name, p, m, times=times)
    for p in P_RANGE:
        for m in range(p, 9):
            assert plan(zb_h1(p, m), times).bubble_fraction == bubble_formula("zb_h1", p, m, times=times), (p, m)


def test_zero_bubble_idles_a_third_of_1f1b():
    """Qi et al.: with T_F = T_B = T_W, ZB-H1's bubble is (p−1) units against 1F1B's 3(p−1) (B+W = 3 after F).
    Planted bug: plan charging an unsplit B T_B only: '1F1B p=1 m=1: 2 == 3'."""
    for p in range(1, 7):
        for m in range(p, 9):
            assert plan(one_f_one_b(p, m)).makespan == 3 * m + 3 * (p - 1), f"1F1B p={p} m={m}"
            assert plan(zb_h1(p, m)).makespan == 3 * m + (p - 1), f"ZB-H1 p={p} m={m}"


def test_plan_respects_every_dependency_and_runs_one_thing_at_a_time():
    """Checked from the spans alone. Planted bug: plan not waiting at a RECV (the ``max`` with the send time
    dropped): 'gpipe p=2 m=1 v=1: B0@s0 starts at 1 before B0@s1 ends at 3'."""
    for name, p, m, v, schedule in all_schedules():
        spans = planned(name, p, m, v).spans
        when = {a: (start, end) for rank in spans for a, start, end in rank}
        last = schedule.n_stages - 1
        for a, (start, end) in when.items():
            needs = {"F": [("F", a.stage - 1)] if a.stage else [],
                     "B": [("F", a.stage)] + ([("B", a.stage + 1)] if a.stage < last else []),
                     "W": [("B", a.stage)]}[a.op]
            for op, stage in needs:
                before = when[Action(op, stage, a.micro_batch)]
                assert start >= before[1], f"{name} p={p} m={m} v={v}: {a} starts at {start} before " \
                                           f"{op}{a.micro_batch}@s{stage} ends at {before[1]}"
        for rank in spans:
            for (_, _, end), (b, start, _) in zip(rank, rank[1:]):
                assert start >= end, f"{name}: {b} overlaps the previous action"


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_peak_activations_equal_the_formula(name):
    """GPipe m, 1F1B and ZB-H1 min(p−r, m), interleaved from Megatron-LM's warm-up count. Planted bugs:
    1F1B warm-up p−r: '1f1b p=1 m=2 v=1: [2] == [1]'; interleaved warm-up (v−1)·round + (p−1−r) (its bubble
    still meets the formula: only this test catches it); GPipe given 1F1B's order."""
    for n, p, m, v, schedule in all_schedules():
        if n == name:
            want = [peak_activations_formula(name, p, m, r, v) for r in range(p)]
            assert planned(name, p, m, v).peak_activations == want, f"{name} p={p} m={m} v={v}"


def test_1f1b_holds_p_micro_batches_where_gpipe_holds_m():
    """The point of 1F1B (numbers from the definition): p=4, m=8 -> [4, 3, 2, 1] against [8, 8, 8, 8].
    Planted bug: one_f_one_b returning GPipe's order: '[8, 8, 8, 8] != [4, 3, 2, 1]'."""
    assert plan(one_f_one_b(4, 8)).peak_activations == [4, 3, 2, 1]
    assert plan(gpipe(4, 8)).peak_activations == [8, 8, 8, 8]
    assert plan(interleaved_1f1b(4, 8, 2)).peak_activations == [4 + 6 + 1, 4 + 4 + 1, 4 + 2 + 1, 4 + 0 + 1]


def test_zb_h1_keeps_every_rank_at_1f1b_first_rank_memory():
    """Qi et al. 3.1: 'all workers maintain the same number of in-flight microbatches' -- p, counting until W --
    so the peak over ranks equals 1F1B's. Planted bug: no deferred W (W after each B): '[4, 3, 2, 1] != [4]*4'."""
    for p in range(1, 7):
        for m in range(p, 9):
            zb, base = plan(zb_h1(p, m)), plan(one_f_one_b(p, m))
            assert zb.peak_in_flight == [p] * p, (p, m)
            assert max(zb.peak_in_flight) == max(base.peak_in_flight) == p
            assert zb.peak_activations == base.peak_activations


@pytest.mark.parametrize("call, text", [
    (lambda: interleaved_1f1b(4, 3, 2), "needs m >= p"),
    (lambda: interleaved_1f1b(2, 5, 2), "use m = 4 or 6"),
    (lambda: zb_h1(4, 2), "use m >= 4, or 1F1B"),
    (lambda: make_schedule("1f1b", 2, 4, v=2), "use 'interleaved' for v > 1"),
    (lambda: make_schedule("dualpipe", 2, 4), "schedule must be one of"),
    (lambda: gpipe(0, 4), "p (ranks) must be a whole number >= 1"),
])
def test_refused_sizes_say_what_to_change(call, text):
    """Planted bug: interleaved's rounds check removed: DID NOT RAISE for p=2, m=5."""
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        call()


# ----------------------------------------------------------------------------- the validator, one rejection each
def edit(schedule: Schedule, rank: int, change) -> Schedule:
    """A copy of ``schedule`` with rank ``rank``'s list of actions passed through ``change``."""
    actions = [list(a) for a in schedule.actions]
    actions[rank] = change([str(a) for a in actions[rank]], actions[rank])
    return replace(schedule, actions=actions)


def A(text: str) -> Action:
    op, rest = text.rsplit("@s", 1)
    i = len(op.rstrip("0123456789"))
    return Action(op[:i], int(rest), int(op[i:]))


def rejected(schedule: Schedule) -> ScheduleError:
    with pytest.raises(ScheduleError) as error:
        validate(schedule)
    assert str(error.value.rank) in str(error.value) and error.value.reason in str(error.value)
    return error.value


def swap(x: str, y: str):
    def change(names, actions):
        i, j = names.index(x), names.index(y)
        actions[i], actions[j] = actions[j], actions[i]
        return actions
    return change


def move_after(x: str, y: str):
    def change(names, actions):
        moved = actions[names.index(x)]
        rest = [a for n, a in zip(names, actions) if n != x]
        at = [str(a) for a in rest].index(y) + 1
        return rest[:at] + [moved] + rest[at:]
    return change


def drop(x: str):
    return lambda names, actions: [a for n, a in zip(names, actions) if n != x]


def test_rejects_a_micro_batch_that_does_not_exist():
    """Planted bug: the micro-batch range check removed -> (1, 'F1@s1', 'missing: ...'): a symptom, not the cause."""
    bad = edit(one_f_one_b(2, 2), 1, lambda names, acts: [A("F2@s1") if n == "F1@s1" else a
                                                          for n, a in zip(names, acts)])
    e = rejected(bad)
    assert (e.rank, str(e.action), e.reason) == (1, "F2@s1", "micro-batch 2 does not exist: there are 2 (0..1)")


def test_rejects_a_stage_on_the_wrong_rank():
    """Planted bug: the owner check removed -> blamed on rank 1's own F0@s1 ('appears twice'), not rank 0."""
    bad = edit(gpipe(2, 1), 0, lambda names, acts: [A("F0@s1") if n == "F0@s0" else a for n, a in zip(names, acts)])
    e = rejected(bad)
    assert (e.rank, str(e.action)) == (0, "F0@s1")
    assert e.reason == "stage 1 belongs to rank 1; rank 0 holds stages [0]: move the action there"


def test_rejects_a_forward_before_its_input_arrives():
    """Swap RECV_F and F. Planted bug: the local-order pass skipped -> DID NOT RAISE."""
    e = rejected(edit(one_f_one_b(2, 2), 1, swap("RECV_F0@s1", "F0@s1")))
    assert (e.rank, str(e.action)) == (1, "F0@s1")
    assert e.reason == "F0@s1 needs its input, but RECV_F0@s1 comes later on rank 1: put RECV_F0@s1 before F0@s1"


def test_rejects_a_dropped_receive():
    """Planted bug: 'comes later'/'is missing' not told apart -> 'RECV_B0@s0 comes later' for a dropped RECV."""
    e = rejected(edit(one_f_one_b(2, 2), 0, drop("RECV_B0@s0")))
    assert (e.rank, str(e.action)) == (0, "B0@s0")
    assert e.reason == ("B0@s0 needs its output gradient, but RECV_B0@s0 is missing on rank 0: "
                        "put RECV_B0@s0 before B0@s0")


def test_rejects_a_backward_before_its_forward():
    """Planted bug: B's dependency on its own F left out of _inputs -> DID NOT RAISE."""
    e = rejected(edit(one_f_one_b(2, 2), 1, swap("F0@s1", "B0@s1")))
    assert (e.rank, str(e.action)) == (1, "B0@s1")
    assert e.reason == "B0@s1 needs its forward, but F0@s1 comes later on rank 1: put F0@s1 before B0@s1"


def test_rejects_a_weight_gradient_before_its_backward():
    """Planted bug: W's dependency left out of _inputs -> blamed on SEND_B0@s1, not W0@s1."""
    e = rejected(edit(zb_h1(2, 2), 1, swap("B0@s1", "W0@s1")))
    assert (e.rank, str(e.action)) == (1, "W0@s1")
    assert e.reason == "W0@s1 needs its B, but B0@s1 comes later on rank 1: put B0@s1 before W0@s1"


def test_rejects_a_missing_and_a_repeated_compute_action():
    """Planted bug: completeness pass skipped -> blamed on SEND_B1@s1 ('needs what it sends'), not the missing B."""
    e = rejected(edit(one_f_one_b(2, 2), 1, drop("B1@s1")))
    assert (e.rank, str(e.action), e.reason) == (1, "B1@s1", "missing: every (stage, micro-batch) needs one B")
    e = rejected(edit(zb_h1(2, 2), 0, drop("W1@s0")))
    assert (e.rank, str(e.action)) == (0, "W1@s0")
    assert e.reason == "missing: every (stage, micro-batch) needs one W (this schedule splits the backward: " \
                       "every B needs its W)"
    e = rejected(edit(gpipe(2, 2), 0, lambda names, acts: acts + [A("F0@s0")]))
    assert (e.rank, str(e.action), e.reason) == (0, "F0@s0", "F0@s0 appears twice: each (stage, micro-batch) "
                                                              "runs one F")


def test_rejects_a_send_nobody_receives():
    """A second SEND_F0@s0 at the end of rank 0. Planted bug: only the common prefix of the pair compared
    (no length check) -> DID NOT RAISE."""
    e = rejected(edit(gpipe(2, 2), 0, lambda names, acts: acts + [A("SEND_F0@s0")]))
    assert (e.rank, str(e.action)) == (0, "SEND_F0@s0")
    assert e.reason == ("rank 1 receives 2 messages from rank 0, this is the 3rd send to it: add RECV_F0@s1 "
                        "on rank 1, or remove this send")


def test_rejects_sends_in_the_wrong_order():
    """Rank 0 sends micro-batch 1 before 0 (SEND_F0 moved after SEND_F1). Planted bug: pairs matched as sets, not
    in order -> DID NOT RAISE (the executor would hand micro-batch 1's activations to micro-batch 0)."""
    e = rejected(edit(gpipe(2, 2), 0, move_after("SEND_F0@s0", "SEND_F1@s0")))
    assert (e.rank, str(e.action)) == (1, "RECV_F0@s1")
    assert e.reason == ("the 1st message from rank 0 is SEND_F1@s0, but the 1st receive from rank 0 here is "
                        "RECV_F0@s1 (messages between two ranks match in order): receive RECV_F1@s1 here, "
                        "or reorder rank 0's sends")


def test_rejects_a_deadlock_naming_every_stuck_rank():
    """Rank 0 waits for the gradient before sending the activation it depends on: a cycle of two RECVs.
    Planted bug: deadlock simulation skipped -> DID NOT RAISE (the real run would hang)."""
    e = rejected(edit(one_f_one_b(2, 1), 0, swap("SEND_F0@s0", "RECV_B0@s0")))
    assert (e.rank, str(e.action)) == (0, "RECV_B0@s0")
    assert e.reason == ("deadlock: rank 0 waits at RECV_B0@s0 for rank 1; rank 1 waits at RECV_F0@s1 for rank 0. "
                        "A RECV blocks until its SEND is issued: move a SEND before the RECV it waits behind")


def test_rejects_a_message_to_a_stage_that_does_not_exist():
    """The last stage has nobody to send its output to. Planted bug: the peer range check removed -> 'rank 0
    receives 1 message from rank 1, ... add RECV_F0@s2 on rank 0' (a stage 2 that does not exist)."""
    e = rejected(edit(gpipe(2, 1), 1, lambda names, acts: acts + [A("SEND_F0@s1")]))
    assert (e.rank, str(e.action)) == (1, "SEND_F0@s1")
    assert e.reason == "stage 1 is the last stage: there is no stage 2 to talk to; remove it"


def test_add_communication_orders_receives_as_the_sender_sends():
    """Rank 1 runs micro-batch 1 first, rank 0 sends 0 first: both RECVs must come before F1 (in order 0, 1).
    Planted bug: each RECV right before its consumer (``at = need[recv]``): 'the 1st message from rank 0 is
    SEND_F0@s0, but the 1st receive from rank 0 here is RECV_F1@s1'."""
    compute = [[A(x) for x in "F0@s0 F1@s0 B0@s0 B1@s0".split()], [A(x) for x in "F1@s1 F0@s1 B0@s1 B1@s1".split()]]
    s = add_communication(Schedule("mine", 2, 2, 1, compute))
    validate(s)
    assert [str(a) for a in s.actions[1][:4]] == ["RECV_F0@s1", "RECV_F1@s1", "F1@s1", "F0@s1"]


def test_add_communication_keeps_a_learners_compute_order():
    """Planted bug: RECVs placed after the action that needs them -> ScheduleError 'B0@s0 needs its output
    gradient, but RECV_B0@s0 comes later on rank 0'."""
    compute = [[A(x) for x in "F0@s0 F1@s0 B0@s0 B1@s0".split()], [A(x) for x in "F0@s1 B0@s1 F1@s1 B1@s1".split()]]
    s = add_communication(Schedule("mine", 2, 2, 1, compute))
    validate(s)
    assert [[a for a in acts if a.op in "FBW"] for acts in s.actions] == compute


# ----------------------------------------------------------------------------- PyTorch's own order
def torch_order(name: str, p: int, m: int, v: int = 1) -> list[list[str]]:
    """Compute actions per rank from ``torch.distributed.pipelining``'s ``pipeline_order``, built without processes.

    Single-stage schedules compute it from ``_num_stages``/``_n_microbatches``; the runtime ones from
    ``_calculate_single_rank_operations`` and four attributes set as their ``__init__`` sets them.
    ZB-H1 is ``ScheduleInterleavedZeroBubble`` with one stage per rank (its ``I`` is our B).
    """
    from torch.distributed.pipelining import schedules as T

    if name in ("gpipe", "1f1b"):
        cls = T.ScheduleGPipe if name == "gpipe" else T.Schedule1F1B
        order = cls._get_pipeline_order(SimpleNamespace(_num_stages=p, _n_microbatches=m))
    else:
        obj = object.__new__(T.ScheduleInterleaved1F1B if name == "interleaved" else T.ScheduleInterleavedZeroBubble)
        obj.pp_group_size, obj.n_local_stages, obj._n_microbatches = p, v, m
        obj.number_of_rounds = max(1, m // p)
        obj.microbatches_per_round = m // obj.number_of_rounds
        order = {r: obj._calculate_single_rank_operations(r) for r in range(p)}
    code = {"F": "F", "B": "B", "I": "B", "W": "W"}
    return [[f"{code[a.computation_type.value]}{a.microbatch_index}@s{a.stage_index}" for a in order[r]
             if a is not None and a.computation_type.value in code] for r in range(p)]


@pytest.mark.parametrize("name", ["gpipe", "interleaved", "zb_h1"])
def test_compute_order_equals_torch_pipeline_order(name):
    """torch 2.13.0; the pitfalls' example (interleaved p=2, v=2, m=4, rank 0: 0F0 0F1 2F0 2F1 0F2 2B0 ...) included.
    Planted bug: interleaved backward chunks in forward order (reverse=False) -> rank 0 '0B0' != '2B0'."""
    compared = 0
    for n, p, m, v, schedule in all_schedules():
        if n == name and p <= 4:
            ours = [[str(a) for a in acts if a.op in ("F", "B", "W")] for acts in schedule.actions]
            assert ours == torch_order(name, p, m, v), f"{name} p={p} m={m} v={v}"
            compared += 1
    assert compared >= 26  # zb_h1 has m >= p only: 8 + 7 + 6 + 5
    if name == "interleaved":
        assert torch_order(name, 2, 4, 2)[0][:6] == ["F0@s0", "F1@s0", "F0@s2", "F1@s2", "F2@s0", "B0@s2"]


def test_1f1b_equals_torch_except_its_last_rank_numbering():
    """torch 2.13.0's ``Schedule1F1B._get_pipeline_order`` (an IR for display and simulation; its
    ``_step_microbatches`` runs its own loop) starts the last rank's forwards at micro-batch 1 (``forward_mb``
    is 0 and incremented before use when there is no warm-up) and lists p−1−r warm-up forwards even when m is
    smaller. Everywhere else it is ours. Planted bug: 1F1B warm-up p−r -> 'p=2 m=1' differs on rank 0."""
    for p in range(1, 5):
        for m in range(max(1, p - 1), 9):
            ours = [[str(a) for a in acts if a.op in ("F", "B")] for acts in one_f_one_b(p, m).actions]
            theirs = torch_order("1f1b", p, m)
            assert ours[:-1] == theirs[:-1], f"p={p} m={m}"
            assert theirs[-1][0] == "F1@s%d" % (p - 1) and ours[-1][0] == "F0@s%d" % (p - 1)  # torch's off-by-one
