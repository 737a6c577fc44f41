"""Program A with the conditional all-reduce moved to the end of the step, still inside ``if rank == 0:``:
rank 0's loss all-reduce now meets rank 1's first gradient all-reduce of the *next* step. Same mistake, same
feedback."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import solution

from coursekit.collectives import ring_all_reduce
from coursekit.models import loss_fn


def train_step(rank, world_size, model, optimizer, inputs, targets):
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    for p in model.parameters():
        ring_all_reduce(p.grad)
        p.grad /= world_size
    optimizer.step()
    mean_loss = loss.detach().clone()
    if rank == 0:
        ring_all_reduce(mean_loss)
        mean_loss /= world_size
        print(f"loss {mean_loss.item():.4f}")
    return mean_loss.item()


ring_sum, make_replica = solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"program_a_fixed": (0, ("world size 2", "the loss all-reduce still runs on rank 0 only",
                                 "world size 3"))}
