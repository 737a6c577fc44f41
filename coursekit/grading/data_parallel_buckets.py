"""Exercise 02, part 1's properties, judged from the all-reduces each backward started (:mod:`.data_parallel_watch`).

* The buckets: each backward all-reduces every trainable gradient once, in buckets of the rule's sizes: the
  parameters in backward order (the reverse of ``model.parameters()``), a new bucket when the next one would take
  it past ``bucket_elements``, a parameter never split.
* The overlap: every bucket's all-reduce starts during backward (from a hook), asynchronously, and is waited for
  only after backward has returned (in ``finish()``).

Each judge returns None when the property holds, else one sentence naming the mistake and what to change.
"""

from __future__ import annotations

from .data_parallel_watch import Issued

__all__ = ["rule_buckets", "bucket_problem", "overlap_problem", "unwaited"]

_USE = "comm.all_reduce(bucket, group=group, async_op=True)"


def rule_buckets(sizes: list[int], cap: int, backward: bool = True) -> list[int]:
    """The elements of each bucket, in the order they fill: ``sizes`` in parameter order, filled from the last."""
    buckets, current = [], 0
    for numel in (reversed(sizes) if backward else sizes):
        if current and current + numel > cap:
            buckets.append(current)
            current = 0
        current += numel
    return buckets + [current]


def _logs(results) -> list[list[Issued]]:
    """Every backward's all-reduces, rank 0's first (each rank's are alike when the answer is right)."""
    return [log for r in results if len(r) > 3 for log in r[3] if isinstance(log, list)]


def _silent(results) -> str:
    sent = sum(r[1].total for r in results if r[1] is not None)
    if sent:
        return (f"no all-reduce was started: the gradients moved by {sent} point-to-point elements (chapter 01's "
                f"ring?), which blocks backward inside every hook. Start each full bucket's {_USE} and wait in "
                f"finish()")
    return (f"nothing was all-reduced during loss.backward() and finish(): register gradient hooks "
            f"(p.register_post_accumulate_grad_hook) that start a full bucket's {_USE}")


def bucket_problem(results, sizes: list[int], cap: int) -> str | None:
    """None if every backward all-reduced the rule's buckets; else what the buckets were, and what is wrong."""
    want = rule_buckets(sizes, cap)
    for log in _logs(results):
        got = [issued.numel for issued in log]
        if not got:
            return _silent(results)
        if sorted(got) == sorted(want):
            continue
        said = f"one backward all-reduced buckets of {got} elements; with buckets of up to {cap} they hold {want}"
        if sum(got) != sum(sizes):
            return (f"{said}: {sum(got)} elements in all, but the trainable gradients are {sum(sizes)}: "
                    f"all-reduce each gradient once per backward")
        if sorted(got) == sorted(sizes):
            return f"{said}: one all-reduce per parameter. Group the gradients into buckets, one all-reduce each"
        if sorted(got) == sorted(rule_buckets(sizes, cap, backward=False)):
            return (f"{said}: these are buckets filled in forward order (model.parameters()). Fill them in "
                    f"backward order, the reverse: the last layer's gradients are ready first")
        return (f"{said} (backward order, a new bucket when the next parameter would take it past {cap} elements, "
                f"a parameter never split)")
    return None


def overlap_problem(results) -> str | None:
    """None if every all-reduce started in backward, asynchronously, and was waited for after it."""
    for log in _logs(results):
        if not log:
            return _silent(results)
        blocking = [issued for issued in log if not issued.asynchronous]
        if blocking:
            return (f"the all-reduce of {blocking[0].numel} elements blocked (async_op=False): backward stood "
                    f"still inside your hook until it ended. Start it with {_USE} and wait for it in finish()")
        late = [issued for issued in log if not issued.in_backward]
        if late:
            return (f"{len(late)} of the {len(log)} all-reduces started after loss.backward() returned (in "
                    f"finish()): nothing of theirs overlapped the backward. Every bucket fills during backward: "
                    f"start its all-reduce from the hook of its last gradient")
        early = [issued for issued in log if issued.waited_in_backward]
        if early:
            return (f"the all-reduce of {early[0].numel} elements was waited for inside backward (in a hook): "
                    f"backward stood still until it ended. Wait for every bucket in finish(), after backward")
    return None


def unwaited(results) -> str:
    """A hint when ``finish()`` returned with asynchronous all-reduces never waited for (their sums never arrived)."""
    never = sum(1 for log in _logs(results) for issued in log if issued.asynchronous and not issued.waited)
    if not never:
        return ""
    return (f" — {never} all-reduce(s) were never waited for: an asynchronous all-reduce's sum is there only after "
            f"its handle's wait(); finish() must wait for each one it started (comm.all_reduce returns None on one "
            f"rank: nothing to wait for there)")
