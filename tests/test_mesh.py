"""coursekit.comm.mesh: the groups of every axis equal torch's init_device_mesh, and they work."""

import pytest
import torch

import coursekit
from coursekit import comm
from coursekit.comm.mesh import Mesh, MeshAxis, as_group, coordinates_of, rank_size

TIMEOUT = 180.0
SHAPES = [{"dp": 4}, {"dp": 2, "tp": 2}, {"dp": 1, "tp": 4}, {"dp": 4, "tp": 1}, {"dp": 2, "pp": 1, "tp": 2}]


def _compare_with_torch(rank, world_size, axes):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = Mesh(axes)
    theirs = init_device_mesh("cpu", tuple(axes.values()), mesh_dim_names=tuple(axes))
    out = {"coordinate": mesh.coordinates()}
    for name in axes:
        axis = mesh[name]
        total = torch.tensor([float(rank)])
        dist.all_reduce(total, group=axis.group)  # the group really holds those ranks
        everyone = [None] * world_size
        dist.all_gather_object(everyone, axis.ranks)
        out[name] = {"ours": axis.ranks, "torch": dist.get_process_group_ranks(theirs.get_group(name)),
                     "rank": axis.rank, "size": axis.size, "torch_rank": theirs.get_local_rank(name),
                     "sum": total.item(), "every_group": sorted(map(tuple, everyone)),
                     "all_groups": sorted(map(tuple, mesh.all_groups(name)))}
    return out


@pytest.mark.parametrize("axes", SHAPES, ids=lambda a: "x".join(f"{k}{v}" for k, v in a.items()))
def test_every_group_equals_torchs_device_mesh(axes):
    results = coursekit.launch(_compare_with_torch, 4, axes, timeout=TIMEOUT)
    for rank, result in enumerate(results):
        for name, size in axes.items():
            got = result[name]
            assert got["ours"] == got["torch"], f"rank {rank}, axis {name!r}: ours {got['ours']}, torch {got['torch']}"
            assert got["size"] == size == len(got["ours"]) and rank in got["ours"]
            assert got["rank"] == got["torch_rank"] == got["ours"].index(rank) == result["coordinate"][name]
            assert got["sum"] == sum(got["ours"]), f"rank {rank}: all-reduce on the {name!r} group"
            assert got["all_groups"] == sorted(set(got["every_group"]))  # every rank's group, no other


def _hybrid_groups(rank, world_size):
    mesh = Mesh({"dp": 2, "tp": 2})
    return mesh["dp"].ranks, mesh["tp"].ranks, mesh.group("dp") is as_group(mesh["dp"]), repr(mesh)


def test_a_2x2_mesh_puts_tensor_parallel_neighbours_together():
    results = coursekit.launch(_hybrid_groups, 4, timeout=TIMEOUT)
    assert [r[0] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]  # dp: same tp coordinate
    assert [r[1] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]  # tp: neighbours
    assert all(r[2] for r in results)
    assert "dp=2 × tp=2" in results[3][3] and "'dp': 1, 'tp': 1" in results[3][3]


def _bad_meshes(rank, world_size):
    errors = []
    for axes in ({"dp": 3}, {}, {"dp": 0, "tp": 4}, [("dp", 4)]):
        try:
            Mesh(axes)
        except ValueError as error:
            errors.append(str(error))
    mesh = Mesh({"dp": 4})
    try:
        mesh["tp"]
    except KeyError as error:
        errors.append(str(error))
    return errors


def test_bad_meshes_say_what_to_change():
    errors = coursekit.launch(_bad_meshes, 4, timeout=TIMEOUT)[0]
    assert len(errors) == 5
    assert "3 = 3 ranks but the world has 4" in errors[0]
    assert "e.g. Mesh" in errors[1] and "e.g. Mesh" in errors[3]
    assert "size >= 1" in errors[2]
    assert "axes ['dp'], not 'tp'" in errors[4]


def test_a_mesh_needs_ranks():
    with pytest.raises(RuntimeError, match="inside a function run by coursekit.launch"):
        Mesh({"dp": 1})
    assert as_group(None) is None and isinstance(MeshAxis("dp", 1, 0, [0], None), MeshAxis)


def test_docstring_example():
    import doctest

    from coursekit.comm import mesh

    failures, tried = doctest.testmod(mesh)
    assert tried > 0 and failures == 0


def _ring_on_each_axis(rank, world_size):
    from coursekit import comm
    from coursekit.collectives import ring_all_reduce

    mesh = Mesh({"dp": 2, "tp": 2})
    out = {}
    for name in ("dp", "tp"):
        with comm.record() as traffic:
            out[name] = ring_all_reduce(torch.full((5,), float(rank)), group=mesh[name]).tolist()
        out[name + "_links"] = sorted(traffic.links)
    return out


def test_the_ring_runs_on_a_mesh_axis_and_counts_global_links():
    results = coursekit.launch(_ring_on_each_axis, 4, timeout=TIMEOUT)
    for rank, result in enumerate(results):
        dp_peer, tp_peer = (rank + 2) % 4, rank ^ 1
        assert result["dp"] == [float(rank + dp_peer)] * 5 and result["tp"] == [float(rank + tp_peer)] * 5
        assert result["dp_links"] == [(rank, dp_peer)] and result["tp_links"] == [(rank, tp_peer)]


def test_rank_size_without_ranks_is_one_rank_of_one():
    """Outside any rank (a notebook cell), code written for a group runs as its only rank."""
    assert rank_size() == (0, 1) and rank_size(None) == (0, 1)
    assert rank_size(MeshAxis("dp", 1, 0, [0], None)) == (0, 1)


def test_rank_size_in_the_simulator_is_each_simulated_rank():
    """Planted bug, seen failing: torch.distributed asked, not the simulator: "[(0, 1), (0, 1), (0, 1)] == ..."."""
    assert comm.simulate(lambda rank, world_size: rank_size(), 3).results == [(0, 3), (1, 3), (2, 3)]


def _where_am_i(rank, world_size):
    mesh = Mesh({"dp": 2, "tp": 2})
    return rank_size(), rank_size(mesh["dp"]), rank_size(mesh["tp"].group), mesh.coordinates()


def test_rank_size_and_coordinates_on_a_2x2_mesh():
    """Rank r sits at row r // 2, column r % 2 of ``[[0, 1], [2, 3]]``; its dp group is its column.

    Planted bugs, seen failing: ``rank_size`` ignoring the group ("rank 0: dp (0, 4), expected (0, 2)"), and
    ``coordinates()`` giving each axis's size ("rank 0: {'dp': 2, 'tp': 2}").
    """
    for rank, (world, dp, tp, coordinates) in enumerate(coursekit.launch(_where_am_i, 4, timeout=TIMEOUT)):
        assert world == (rank, 4), f"rank {rank}: world {world}"
        assert dp == (rank // 2, 2), f"rank {rank}: dp {dp}, expected {(rank // 2, 2)}"
        assert tp == (rank % 2, 2), f"rank {rank}: tp {tp}, expected {(rank % 2, 2)}"
        assert coordinates == {"dp": rank // 2, "tp": rank % 2}, f"rank {rank}: {coordinates}"


def test_coordinates_of_any_rank_need_no_ranks():
    """The same grid as ``torch.arange(world).view(sizes)``, read without building a mesh."""
    shape = {"dp": 2, "pp": 1, "tp": 3}
    grid = torch.arange(6).view(2, 1, 3)
    for rank in range(6):
        expected = dict(zip(shape, map(int, (grid == rank).nonzero()[0])))
        assert coordinates_of(rank, shape) == expected, f"rank {rank}"
    assert coordinates_of(5, shape) == {"dp": 1, "pp": 0, "tp": 2}


def _flattened(rank, world_size):
    import torch.distributed as dist

    mesh = Mesh({"dp": 2, "sp": 2, "tp": 2})
    flat = mesh.flatten(("dp", "sp"))
    total = torch.tensor([float(rank)])
    dist.all_reduce(total, group=flat.group)  # the group really holds those ranks
    errors = []
    for names in (("sp", "dp"), ("dp", "cp"), ()):
        try:
            mesh.flatten(names)
            errors.append("no error")
        except (KeyError, ValueError) as error:
            errors.append(f"{type(error).__name__}: {error}")
    merged = Mesh({"dpsp": 4, "tp": 2})["dpsp"]  # the same ranks, built as one axis
    return (flat.name, flat.ranks, flat.rank, flat.size, total.item(), mesh.flatten(("dp", "sp")) is flat,
            merged.ranks, merged.rank, mesh.flatten("tp").ranks == mesh["tp"].ranks, errors)


def test_flatten_gives_the_group_spanning_several_axes():
    """On Mesh({"dp": 2, "sp": 2, "tp": 2}) (8 ranks, grid ``arange(8).view(2, 2, 2)``), ``flatten(("dp", "sp"))``
    is the ranks sharing this rank's tp coordinate: ``[t, t + 2, t + 4, t + 6]``, this rank's index in it
    ``2·dp + sp``, the same group a mesh built with one axis of 4 there gives; an all-reduce over it sums
    exactly those ranks; the axis is named "dp×sp" and built once. Axes out of order or unknown are refused.
    Planted bugs, seen failing: the named axes moved first instead of last ("rank 0: dp×sp [0, 1, 2, 3], expected
    [0, 2, 4, 6]"); the index in the group taken as the dp coordinate ("rank 2: index 0, expected 1")."""
    results = coursekit.launch(_flattened, 8, timeout=TIMEOUT)
    for rank, (name, ranks, index, size, total, cached, merged, merged_index, one_axis, errors) in enumerate(results):
        tp, dp, sp = rank % 2, rank // 4, (rank // 2) % 2
        expected = [tp + 2 * k for k in range(4)]
        assert (name, size, ranks) == ("dp×sp", 4, expected), f"rank {rank}: {name} {ranks}, expected {expected}"
        assert index == 2 * dp + sp == ranks.index(rank), f"rank {rank}: index {index}, expected {2 * dp + sp}"
        assert (ranks, index) == (merged, merged_index) and cached and one_axis, rank
        assert total == sum(expected), f"rank {rank}: the all-reduce summed {total}, expected {sum(expected)}"
        assert errors[0].startswith("ValueError: flatten takes distinct axes in the mesh's order"), errors[0]
        assert errors[1].startswith("KeyError") and "'cp'" in errors[1] and errors[2].startswith("KeyError"), errors
