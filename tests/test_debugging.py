"""Chapter 09's cases, one launch each: every classic bug made on purpose, and the sentence of the report that names it.

Two ranks wherever the bug allows (the course's machine has 2 cores), timeouts of 2 s for the cases that hang.
The expected phrases are the bug's facts (which rank, which call, which peer, which tensor), written from the
program, not copied from a report.
"""

import os
import pickle
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import coursekit
from coursekit import Cluster, LaunchTimeout, RankError, check_replicas, comm, launch, nonfinite_ranks, tiny_mlp
from coursekit.collectives import ring_all_reduce
from coursekit.parallel.pipeline.schedules import Action

HANG_S = 2.0  # the launcher's timeout in the cases that hang


def assert_times_out(fn, world_size=2):
    with pytest.raises(LaunchTimeout) as info:
        launch(fn, world_size, timeout=HANG_S)
    return info.value


def assert_fails(fn, world_size=2, **options):
    with pytest.raises(RankError) as info:
        launch(fn, world_size, timeout=10, **options)
    return info.value


# 1. A collective that only some ranks call.
def only_rank_0_reduces(rank, world_size):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    return rank


def test_a_collective_on_one_rank_names_that_rank_its_torch_call_and_the_rank_that_returned():
    error = assert_times_out(only_rank_0_reduces)
    assert error.ranks == [0] and error.finished == [1]
    assert error.waiting[0].startswith("inside torch.distributed.all_reduce"), error.waiting[0]
    assert "only_rank_0_reduces (test_debugging.py:" in error.waiting[0], "the learner's frame is missing"
    assert "ranks [1] had returned their results" in str(error)


# 2. A rank that dies while the others wait in a collective.
def rank_1_dies(rank, world_size):
    if rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(4))


def test_a_rank_that_dies_is_blamed_not_the_peer_that_saw_the_connection_go():
    error = assert_fails(rank_1_dies)
    assert error.rank == 1, f"rank {error.rank} blamed: the innocent peer's gloo error, not the death"
    assert "rank 1 exited with code 3 before returning a result" in str(error)


# 3. Tensors of different lengths in one collective.
def test_mismatched_lengths_are_refused_by_the_length_check_naming_both_lengths():
    error = assert_fails(lambda rank, world_size: ring_all_reduce(torch.ones(4 if rank == 0 else 3)))
    assert "rank 0 has 4 elements of torch.float32 but rank 1 has 3 elements of torch.float32" in str(error)


def receive_too_small(rank, world_size):
    if rank == 0:
        comm.send(torch.ones(4), dst=1)
    else:
        comm.recv(torch.empty(3), src=0)


def test_a_receive_too_small_kills_the_receiver_on_gloo_and_is_a_sentence_in_the_simulator():
    error = assert_fails(receive_too_small)
    assert error.rank == 1 and "rank 1 was killed by signal SIGABRT" in str(error)
    with pytest.raises(comm.SimulatorError, match="rank 1 posted a receive of 3 torch.float32 elements from rank 0, "
                                                  "which sent 4 torch.float32 elements"):
        comm.simulate(receive_too_small, 2)


# 4. Collectives in a different order on different ranks, under TORCH_DISTRIBUTED_DEBUG=DETAIL.
def reduce_then_broadcast_on_rank_0(rank, world_size):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
    else:
        dist.broadcast(t, src=0)
        dist.all_reduce(t)


def test_detail_reaches_the_ranks_through_env_and_names_both_collectives():
    error = assert_fails(reduce_then_broadcast_on_rank_0, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    text = str(error)
    assert "Detected mismatch between collectives on ranks" in text
    assert "Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE" in text
    assert "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=BROADCAST" in text


def read_test_env(rank, world_size):
    return os.environ.get("COURSEKIT_TEST_ENV")


def test_env_is_set_in_every_rank_and_not_in_the_caller():
    assert "COURSEKIT_TEST_ENV" not in os.environ
    assert launch(read_test_env, 2, env={"COURSEKIT_TEST_ENV": "on"}, timeout=20) == ["on", "on"]
    assert launch(read_test_env, 2, env={"COURSEKIT_TEST_ENV": "spawned"}, start_method="spawn",
                  timeout=60) == ["spawned", "spawned"]  # the spec is pickled: a path of its own
    with Cluster(2, env={"COURSEKIT_TEST_ENV": "warm"}, timeout=20) as cluster:
        assert cluster.run(read_test_env) == ["warm", "warm"]
    assert "COURSEKIT_TEST_ENV" not in os.environ, "the caller's environment was changed"


@pytest.mark.parametrize("env", [{"TORCH_DISTRIBUTED_DEBUG": 1}, ["TORCH_DISTRIBUTED_DEBUG=DETAIL"]])
def test_env_that_is_not_names_to_strings_is_refused_before_any_rank_starts(env):
    with pytest.raises(ValueError, match="env must map variable names to strings"):
        launch(lambda rank, world_size: rank, 2, env=env)


# 5. Point-to-point deadlocks: the simulator and the real ranks say the same thing.
def send_without_receive(rank, world_size):
    if rank == 0:
        comm.send(torch.ones(4), dst=1)  # rank 1 never posts the receive


def test_a_send_without_its_receive_in_the_simulator_and_on_real_ranks():
    with pytest.raises(comm.Deadlock) as simulated:
        comm.simulate(send_without_receive, 2)
    assert simulated.value.waiting == {0: "send to rank 1, 4 elements"} and simulated.value.finished == [1]
    real = assert_times_out(send_without_receive)
    assert real.ranks == [0] and real.finished == [1]
    assert real.waiting[0].startswith("waiting on send to rank 1, 4 elements"), real.waiting[0]


def receive_from_the_wrong_side(rank, world_size):
    right = (rank + 1) % world_size
    sending = comm.isend(torch.full((4,), float(rank)), dst=right)
    comm.recv(torch.empty(4), src=right)  # the bug: the message comes from the left
    sending.wait()


def test_a_receive_from_the_wrong_peer_shows_every_rank_waiting_on_its_right_neighbour():
    with pytest.raises(comm.Deadlock) as simulated:
        comm.simulate(receive_from_the_wrong_side, 3)
    assert simulated.value.waiting == {r: f"recv from rank {(r + 1) % 3}, 4 elements" for r in range(3)}
    real = assert_times_out(receive_from_the_wrong_side, 3)
    assert real.ranks == [0, 1, 2]
    for rank in range(3):
        assert real.waiting[rank].startswith(f"waiting on recv from rank {(rank + 1) % 3}, 4 elements")


# 6. Pipelines that would hang: refused before anything runs.
def test_a_pipeline_with_too_few_micro_batches_or_a_missing_receive_is_refused():
    with pytest.raises(ValueError, match="interleaved 1F1B needs m >= p"):
        coursekit.make_schedule("interleaved", 4, 2, v=2)
    schedule = coursekit.make_schedule("1f1b", 2, 2)
    schedule.actions[1].remove(Action("RECV_F", 1, 1))
    with pytest.raises(coursekit.ScheduleError, match="RECV_F1@s1 is missing on rank 1") as info:
        coursekit.validate(schedule)
    assert info.value.rank == 1


# 7. Silent divergence: the replicas' first differing parameter.
def test_replicas_from_their_own_seeds_differ_first_in_the_first_weight_by_the_seeds_difference():
    reports = launch(lambda rank, world_size: check_replicas(tiny_mlp(seed=rank)), 2, timeout=20)
    assert [str(r) for r in reports] == [str(reports[0])] * 2, "every rank must get the same report"
    expected = (tiny_mlp(seed=1).layers[0].weight - tiny_mlp(seed=0).layers[0].weight).abs().max().item()
    report = reports[0]
    assert (report.name, report.ranks, report.index) == ("layers.0.weight", [1], (0, 0))
    assert report.max_abs_diff == pytest.approx(expected, rel=1e-6)
    assert "replicas differ: first 'layers.0.weight', rank 1 differs from rank 0" in str(report)


def one_ulp_off_on_rank_2(rank, world_size):
    model = tiny_mlp(seed=0)
    if rank == 2:
        with torch.no_grad():
            bias = model.layers[1].bias
            bias[3] = torch.nextafter(bias[3], torch.tensor(1.0))  # the smallest change a float32 allows
    return check_replicas(model), check_replicas({"same": torch.ones(2)})


def test_one_bit_of_difference_in_a_later_tensor_is_found_and_equal_replicas_agree():
    (report, same), *_ = launch(one_ulp_off_on_rank_2, 3, timeout=20)
    assert (report.name, report.ranks, report.index) == ("layers.1.bias", [2], (3,)), str(report)
    assert same.ok and str(same) == "replicas agree: 1 tensors bit-identical on 3 ranks"


# 8. A NaN on one rank, found before the all-reduce spreads it.
def nan_on_rank_1_at_step_2(rank, world_size):
    model = tiny_mlp(seed=0)
    for step in range(4):
        x = torch.ones(2, 16)
        if rank == 1 and step == 2:
            x[0, 0] = float("nan")
        model.zero_grad()
        model(x).sum().backward()
        bad = nonfinite_ranks({name: p.grad for name, p in model.named_parameters()})
        if bad:
            return step, bad
        for p in model.parameters():
            dist.all_reduce(p.grad)
    return None


def test_the_first_rank_and_step_with_a_nan_gradient_is_the_same_answer_on_every_rank():
    assert launch(nan_on_rank_1_at_step_2, 2, timeout=20) == [(2, {1: "layers.0.weight"})] * 2


# 9. monitored_barrier names the rank that never arrives.
def rank_1_never_arrives(rank, world_size):
    if rank == 1:
        time.sleep(60)
    dist.monitored_barrier(timeout=timedelta(seconds=1))


def test_monitored_barrier_names_the_missing_rank():
    error = assert_fails(rank_1_never_arrives)
    assert error.rank == 0 and "Rank 1 failed to pass monitoredBarrier in 1000 ms" in str(error)


# The Flight Recorder, as chapter 09 reads it on gloo.
def flight_record(rank, world_size):
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(4), async_op=True).wait(timedelta(seconds=1))
        except RuntimeError:
            pass
    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace())


def test_the_flight_recorder_on_gloo_counts_the_collectives_each_rank_enqueued():
    traces = launch(flight_record, 2, timeout=20)
    status = [trace["pg_status"]["0"] for trace in traces]
    assert [s["last_enqueued_collective"] for s in status] == [2, 1]
    assert [e["profiling_name"] for e in traces[0]["entries"]] == ["gloo:all_reduce"] * 2
