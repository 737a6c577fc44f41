"""The library's own answers handed in: coursekit.parallel.sequence's merge as the merge, and its ring_attention as
the loop. Everything would be exact, and nothing is the learner's: while the grader runs them, the library's answers
to exercise 06 refuse (coursekit.answers), and every check says so.

Seen scoring 12/12 before merge and ring_attention were listed as answers to 06_ring_attention and held back."""

from coursekit.parallel.sequence import merge, ring_attention  # noqa: F401  (merge: the mistake)

EXERCISE = "06_ring_attention"
SCORE = 0  # every case raises AnswerHeldBack (G = 1 too: a failed precondition costs as a case); merge_exact says
# it once
LOSES = {"merge_exact": (0, ("merge raised AnswerHeldBack", "it is coursekit's own answer to exercise 06_ring_attention",
                             "write the online-softmax merge yourself")),
         "ring_equals_full_attention": (0, ("G=1: rank 0 raised coursekit.answers.AnswerHeldBack",
                                            "write the ring loop yourself")),
         "causal_masking": (0, "rank 0 raised coursekit.answers.AnswerHeldBack"),
         "key_value_gradients": (0, "rank 0 raised coursekit.answers.AnswerHeldBack"),
         "traffic_pattern": (0, "rank 0 raised coursekit.answers.AnswerHeldBack")}


def ring_attention_forward(q, k, v, causal=False):
    return ring_attention(q, k, v, causal)
