"""Exercise 03's solution (as in tools/notebook_src/03_model_parallel.py), written as templates of the typical
mistakes: ``first_stage_with()`` and ``second_stage_with()`` with no arguments build the solution; each keyword
swaps in one mistake, so that every mp_* attempt in this folder states its mistake and nothing else."""

import torch
import torch.nn.functional as F

from coursekit import comm


def first_stage_with(detach=True, zero_grad=False, gradient_first=False, receive_loss=False, keep_detached=False):
    """``detach=False``: activations sent attached; ``zero_grad``: gradients zeroed at every call;
    ``gradient_first``: waits for the gradient before sending; ``receive_loss``: also receives the loss;
    ``keep_detached``: detaches the activations as they are computed, so backward starts from a tensor with no graph."""
    def first_stage(stage, inputs):
        if zero_grad:
            stage.zero_grad()
        activations = stage(inputs).detach() if keep_detached else stage(inputs)
        grad = torch.empty_like(activations)
        if gradient_first:
            comm.recv(grad, src=1)
        comm.send(activations.detach() if detach else activations, dst=1)
        if not gradient_first:
            comm.recv(grad, src=1)
        activations.backward(grad)
        if receive_loss:
            comm.recv(torch.empty(1), src=1)
    return first_stage


def second_stage_with(requires_grad=True, gradient_to=0, send_loss=False, returns=True, own_loss=False):
    """``requires_grad=False``: no inputs.requires_grad_(); ``gradient_to``: where the gradient goes;
    ``send_loss``: also sends the loss to rank 0; ``returns=False``: returns nothing; ``own_loss``:
    F.cross_entropy instead of the loss_fn it is given."""
    def second_stage(stage, targets, loss_fn, shape):
        inputs = torch.empty(shape)
        comm.recv(inputs, src=0)
        if requires_grad:
            inputs.requires_grad_()
        loss = F.cross_entropy(stage(inputs), targets) if own_loss else loss_fn(stage(inputs), targets)
        loss.backward()
        comm.send(inputs.grad, dst=gradient_to)
        if send_loss:
            comm.send(loss.detach().reshape(1), dst=0)
        return loss if returns else None
    return second_stage


first_stage, second_stage = first_stage_with(), second_stage_with()
