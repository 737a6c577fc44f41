"""The launcher's benchmark measures cold ``launch`` against a floor: fork + TCPStore + init_process_group."""

import pytest

from coursekit.bench.launch import bare_launch


def _fails_on_rank_1(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)  # the ranks really joined one group
    assert t.item() == world_size
    if rank == 1:
        raise ValueError("planted")


def test_the_floor_starts_ranks_that_join_one_group_and_reports_a_failed_exit():
    bare_launch(2)
    with pytest.raises(RuntimeError, match="1 of 2 ranks exited with an error"):
        bare_launch(2, _fails_on_rank_1)
