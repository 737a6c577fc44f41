"""PassRight's backward sends the gradient on to the right, the way the block went, instead of back to its
owner on the left. At G = 2 both neighbours are the same rank, so it is right there; at G = 3 and 4 each
gradient reaches the wrong rank. Forward, outputs and dq are the solution's.

Seen failing before the fix (G = 2 counted as a real case of key_value_gradients):
"gradient_passed_right: key_value_gradients earned 0.67, not 0"."""

import torch

from coursekit import comm
from _ra_solution import functions, loop_with

EXERCISE = "06_ring_attention"
SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"key_value_gradients": (0, ("G=3: rank 0's gradient of k differs from full attention's by",
                                     "a block's gradient goes back to the rank the block came from")),
    "traffic_pattern": (0, "counts only for a right answer")}

_solution = functions()
merge = _solution["merge"]


class PassRight(_solution["PassRight"]):
    @staticmethod
    def backward(ctx, grad_incoming, grad_o):
        rank, size = comm.get_rank(), comm.get_world_size()
        grad_block = torch.empty_like(grad_incoming)
        works = [comm.isend(grad_incoming.contiguous(), dst=(rank + 1) % size),  # the planted mistake
                 comm.irecv(grad_block, src=(rank - 1) % size)]
        for work in works:
            work.wait()
        return grad_block, grad_o


ring_attention_forward = loop_with(PassRight=PassRight)  # the solution's loop, with this pass
