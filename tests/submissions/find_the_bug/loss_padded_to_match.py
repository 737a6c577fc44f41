"""Program A "fixed" by padding the loss to 1,024 elements, as if the length error were the bug: the loss
all-reduce still runs on rank 0 only, and now meets rank 1's gradient all-reduce with 1,024 elements against a
gradient's. The feedback must name the conditional collective, not repeat the library's hint ("did one rank build
its gradients differently?"), the wrong reading the exercise warns about (issue 42, item 6)."""

import torch
from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import solution

from coursekit.collectives import ring_all_reduce
from coursekit.models import loss_fn


def train_step(rank, world_size, model, optimizer, inputs, targets):
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    mean_loss = torch.zeros(1024)                    # as long as a gradient, so the lengths agree?
    mean_loss[0] = loss.detach()
    if rank == 0:
        ring_all_reduce(mean_loss)
        mean_loss /= world_size
        print(f"loss {mean_loss[0].item():.4f}")
    for p in model.parameters():
        ring_all_reduce(p.grad)
        p.grad /= world_size
    optimizer.step()
    return mean_loss[0].item()


ring_sum, make_replica = solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"program_a_fixed": (0, ("world size 2", "a collective runs on rank 0 only", "Padding the loss",
                                 "the loss all-reduce inside `if rank == 0:`"))}
