"""PassRight.backward returns the gradient it got, as if the pass were the identity: nothing is sent back, so the
gradient of a received block stays on the rank that received it and is added to its own keys and values.
Forward, outputs and dq are the solution's.

Seen failing with the symptom only before the fix: "G=2: rank 0's gradient of k differs from full attention's by"."""

from _ra_solution import functions, loop_with

EXERCISE = "06_ring_attention"
SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"key_value_gradients": (0, ("G=2: rank 0's gradient of k differs from full attention's by",
                                     "PassRight.backward sent nothing",
                                     "send grad_incoming to rank r−1")),
    "traffic_pattern": (0, "counts only for a right answer")}

_solution = functions()
merge = _solution["merge"]


class PassRight(_solution["PassRight"]):
    @staticmethod
    def backward(ctx, grad_incoming, grad_o):
        return grad_incoming, grad_o  # the mistake: kept here, not sent back to the block's owner


ring_attention_forward = loop_with(PassRight=PassRight)  # the solution's loop, with this pass
