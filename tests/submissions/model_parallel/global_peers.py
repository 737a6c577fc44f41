"""Exercise 03: the peers named dst=1 and src=0, global ranks, while the calls pass group=. Right in the world of two
ranks; in the second pipeline of a 2 × 2 mesh ([2, 3]) rank 1 is not a member, and comm says so."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 11.67  # the hidden check: 2 of its 3 cases (points are rounded to hundredths)
LOSES = {"other_splits_and_sizes": (0.67, ("rank 2 raised ValueError: global rank 1 is not in this group (its global "
                                            "ranks are [2, 3])", "group_dst=/group_src="))}


two_stage_step = two_stage_step_with(global_peers=True)  # the mistake: dst=/src= (global ranks), not group_dst=/group_src=
