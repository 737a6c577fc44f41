"""Exercise 03's solution (as in tools/notebook_src/03_model_parallel.py), written as a template of the typical
mistakes: ``two_stage_step_with()`` with no arguments builds the solution; each keyword swaps in one mistake, so
that every attempt in this folder states its mistake and nothing else."""

import torch
import torch.nn.functional as F

from coursekit import comm


def two_stage_step_with(detach=True, gradient_first=False, requires_grad=True, gradient_to_self=False,
                        keep_detached=False, returns=True, own_loss=False, send_loss=False, scaled=True,
                        zero_grad_each=False, all_forwards_first=False, global_peers=False):
    """``detach=False``: activations sent attached; ``gradient_first``: the first stage waits for the gradient
    before sending; ``requires_grad=False``: the buffer received is not made to require grad; ``gradient_to_self``:
    the gradient sent to the last stage itself; ``keep_detached``: the first stage keeps detached activations;
    ``returns=False``: returns nothing; ``own_loss``: F.cross_entropy instead of the loss_fn given; ``send_loss``:
    the loss sent to the first stage too; ``scaled=False``: the micro-batches' means summed; ``zero_grad_each``:
    stage.zero_grad() per micro-batch; ``all_forwards_first``: the first stage sends every micro-batch before it
    receives a gradient; ``global_peers``: peers named 0 and 1 as global ranks, whatever the group."""
    def peer(rank, role):
        return {role: rank} if global_peers else {f"group_{role}": rank}

    def first_stage(stage, xs, group):
        kept = []
        for x in xs:
            if zero_grad_each:
                stage.zero_grad()
            activations = stage(x).detach() if keep_detached else stage(x)
            grad = torch.empty_like(activations)
            if gradient_first:
                comm.recv(grad, group=group, **peer(1, "src"))
            comm.send(activations.detach() if detach else activations, group=group, **peer(1, "dst"))
            kept.append((activations, grad))
            if not all_forwards_first:
                _backward(kept.pop(), gradient_first, group, peer, send_loss)
        for pair in kept:
            _backward(pair, gradient_first, group, peer, send_loss)

    def last_stage(stage, ys, batch, loss_fn, width, group):
        total = 0.0
        for y in ys:
            if zero_grad_each:
                stage.zero_grad()
            received = torch.empty(len(y), width)
            comm.recv(received, group=group, **peer(0, "src"))
            if requires_grad:
                received.requires_grad_()
            output = stage(received)
            loss = F.cross_entropy(output, y) if own_loss else loss_fn(output, y)
            loss = loss * (len(y) / batch) if scaled else loss
            loss.backward()
            comm.send(received.grad, group=group, **peer(1 if gradient_to_self else 0, "dst"))
            if send_loss:
                comm.send(loss.detach().reshape(1), group=group, **peer(0, "dst"))
            total += loss.item()
        return total

    def two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches, group=None):
        xs, ys = inputs.tensor_split(micro_batches), targets.tensor_split(micro_batches)
        if comm.get_rank(group) == 0:
            first_stage(stage, xs, group)
            return None
        total = last_stage(stage, ys, len(targets), loss_fn, width, group)
        return total if returns else None

    return two_stage_step


def _backward(pair, gradient_first, group, peer, send_loss):
    activations, grad = pair
    if not gradient_first:
        comm.recv(grad, group=group, **peer(1, "src"))
    if send_loss:
        comm.recv(torch.empty(1), group=group, **peer(1, "src"))
    activations.backward(grad)


two_stage_step = two_stage_step_with()
