"""The solution of exercise 02, as in tools/notebook_src: the attempts here reuse the part they get right."""

import torch

from coursekit import comm
from coursekit.collectives import ring_all_reduce
from coursekit.collectives import ring_reduce_scatter as _chapter_reduce_scatter


def attach_gradient_averaging(model, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        ring_all_reduce(param.grad, group=group)
        param.grad.div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)


def reduce_scatter_gradients(model, group=None):
    world_size = comm.get_world_size(group)
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return _chapter_reduce_scatter(flat, group=group) / world_size  # a tensor of its own: flat can be freed
