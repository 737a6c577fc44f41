"""coursekit.train: one loop for every strategy; data parallelism on a mesh axis; a new strategy plugs in."""

import pytest
import torch.distributed as dist

import coursekit
from coursekit.comm.mesh import Mesh
from coursekit.strategy import STRATEGIES, Strategy, get_strategy, mesh_for, register
from coursekit.train import train
from coursekit.measure.verify import compare

TIMEOUT = 240.0
DATA_PARALLEL = ("naive", "bucketed", "zero1", "zero2", "zero3")
CONFIG = dict(model="mlp", steps=3, global_batch=7, optimizer="adam", lr=1e-2)  # 7: uneven
BUCKETS = dict(bucket_elements=2000)  # for the strategies that read it


def _on_the_dp_axis(rank, world_size):
    mesh = Mesh({"dp": 2, "tp": 2})
    return mesh["dp"].ranks, [train(rank, world_size, s, mesh=mesh, **CONFIG, **({} if s == "naive" else BUCKETS))
                              ["records"] for s in DATA_PARALLEL]


def test_data_parallelism_on_the_dp_axis_of_a_2x2_mesh_equals_one_process():
    results = coursekit.launch(_on_the_dp_axis, 4, timeout=TIMEOUT)
    reference = train(0, 1, "single", **CONFIG)["records"]
    for ranks in ([0, 2], [1, 3]):
        assert all(results[r][0] == ranks for r in ranks)
        for i, strategy in enumerate(DATA_PARALLEL):
            report = compare(reference, [results[r][1][i] for r in ranks])  # in dp order: shards reassemble
            assert report.ok, f"{strategy} on the dp group {ranks} of a 2 x 2 mesh: {report}"


class _AllReduceThenDivide(Strategy):
    """A strategy written outside the library: torch's all-reduce of every gradient after backward."""

    def __init__(self, setup):
        super().__init__(setup)
        for p in self.model.parameters():
            dist.broadcast(p.data, src=0)

    def synchronize(self):
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.data_size


def _plugged_in(rank, world_size):
    register("test_all_reduce")(_AllReduceThenDivide)
    return train(rank, world_size, "test_all_reduce", **CONFIG)["records"]


def test_a_new_strategy_plugs_in_without_touching_the_loop():
    results = coursekit.launch(_plugged_in, 3, timeout=TIMEOUT)
    report = compare(train(0, 1, "single", **CONFIG)["records"], results)
    assert report.ok, str(report)
    assert "test_all_reduce" not in STRATEGIES  # registered inside the ranks only


def test_unknown_options_and_strategies_say_what_exists():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['bucket_elemnts'\].*bucket_elements"):
        train(0, 1, "single", bucket_elemnts=10)
    with pytest.raises(ValueError, match="strategy='no_such_strategy'.*'zero3'"):
        train(0, 1, "no_such_strategy")


@pytest.mark.parametrize("strategy, options, says", [
    # a typo: no strategy reads it; the nearest option is named
    ("naive", {"bucket_elemnts": 10}, r"unknown option\(s\) \['bucket_elemnts'\]: no strategy reads it "
                                      r"\(did you mean bucket_elements=\?\); strategy='naive' takes collectives="),
    # another strategy's option: the strategies that read it are named
    ("naive", {"bucket_cap_mb": 1.0}, r"strategy='naive' does not read bucket_cap_mb=: it is an option of "
                                      r"'bucketed', .*'zero1'"),
    # precision= where the strategy computes in fp32 only: refused, not run in fp32
    ("tensor", {"precision": "bf16"}, r"strategy='tensor' does not read precision=: it is an option of 'naive', "
                                      r"'bucketed'.*strategy='tensor' takes no option"),
    ("single", {"precision": "bf16"}, r"strategy='single' does not read precision="),
])
def test_an_option_the_strategy_does_not_read_is_refused_by_name(strategy, options, says):
    """Planted bug, seen failing: options checked against every strategy's names together (as before): the
    last three ran, ``"tensor"`` and ``"single"`` in fp32."""
    with pytest.raises(ValueError, match=says):
        train(0, 1, strategy, model="transformer", steps=1, **options)


def _wrong_meshes(rank, world_size):
    mesh = Mesh({"dp": 1, "sp": 2})
    errors = []
    for strategy, options in (("dp_tp", {"mesh": mesh}), ("tensor", {"mesh": mesh}), ("naive", {"mesh": mesh["dp"]}),
                              ("sequence_data", {"mesh": mesh, "sp": 1})):
        try:
            train(rank, world_size, strategy, model="transformer", steps=1, **options)
            errors.append("no error")
        except (TypeError, ValueError) as error:
            errors.append(f"{type(error).__name__}: {error}")
    return errors


def test_a_mesh_without_the_axes_a_strategy_takes_is_refused_naming_both():
    """Planted bug, seen failing: no check of the axes: the rank fails with the mesh's own KeyError ("this mesh
    has axes ['dp', 'sp'], not 'tp'"), which names neither the strategy nor the axes it takes."""
    dp_tp, tensor, axis, both = coursekit.launch(_wrong_meshes, 2, timeout=TIMEOUT)[0]
    assert dp_tp.startswith("ValueError") and "strategy='dp_tp' takes the mesh axes ['dp', 'tp']" in dp_tp, dp_tp
    assert "this mesh has ['dp', 'sp'] (no 'tp')" in dp_tp, dp_tp
    assert "strategy='tensor' takes the mesh axes ['tp']" in tensor and "has ['dp', 'sp']" in tensor, tensor
    assert axis.startswith("TypeError") and "Mesh" in axis and "not MeshAxis" in axis, axis
    assert "sp=1" in both and "'sp' axis has 2 ranks" in both, both


def test_one_documented_way_mesh_not_group():
    """``group=`` is gone; the default mesh of each strategy, without building one.

    Planted bug, seen failing: the two axes' default sizes swapped ("{'dp': 4, 'tp': 2} == {'dp': 2, 'tp': 4}").
    """
    with pytest.raises(TypeError, match=r"train\(\) takes mesh= .*not group="):
        train(0, 1, "naive", group=None)
    assert mesh_for("naive", 4, {}) is None  # one axis: every rank, no mesh built
    assert get_strategy("dp_tp").default_mesh(8, {"tp": 4}) == {"dp": 2, "tp": 4}
    assert get_strategy("dp_tp").default_mesh(4, {}) == {"dp": 2, "tp": 2}  # the option's default, tp=2
    assert get_strategy("sequence_data").default_mesh(6, {"sp": 3}) == {"dp": 2, "sp": 3}
    assert [get_strategy(s).axes for s in ("naive", "zero2", "tensor", "ring_attention", "pipeline")] == \
        [("dp",), ("dp",), ("tp",), ("sp",), ("pp",)]


def test_a_progress_bar_on_rank_zero_only(capfd):
    coursekit.launch(lambda r, n: train(r, n, "naive", steps=4, progress=True, record=False), 2, timeout=TIMEOUT)
    err = capfd.readouterr().err
    assert "[rank 0]" in err and "4/4" in err and "loss=" in err, err
    assert "[rank 1]" not in err, err


def test_on_start_and_on_step_hooks():
    """``on_start`` sets the first step (a resumed run's); ``on_step`` sees each step's number and loss.

    Planted bug, seen failing: the loop counting from 0 whatever on_start returned (steps [0, 1], 2 losses too).
    """
    seen, built = [], []

    def start(runner):
        built.append(type(runner).__name__)
        return 2

    result = train(0, 1, "single", steps=4, on_start=start, on_step=lambda *a: seen.append((a[0], a[1])))
    assert built == ["Strategy"]
    assert [s for s, _ in seen] == [2, 3]
    assert [loss for _, loss in seen] == result["losses"]
