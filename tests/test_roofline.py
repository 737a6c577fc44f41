"""The roofline probe (coursekit.measure.roofline): the roof by hand, the ops' FLOPs and bytes by hand, the
probe's FLOPs counted by torch, the network's roof against chapter 01's all-reduce time, and the probes
running (positive, finite numbers in quick mode: no timing thresholds here -- speed belongs to benchmarks).

Planted, seen failing (each bug put into roofline.py by hand, the tests run, the bug taken out):

* the ridge inverted (``bandwidth / peak``) -> test_the_roof_by_hand "ridge 0.05, by hand 200e9 / 10e9 = 20";
* ``attainable`` as ``max`` -> "attainable(5) = 200000000000.0, by hand min(200e9, 5 × 10e9) = 5e10";
* the matmul's FLOPs without the 2 (``m * k * n``) -> test_ops_by_hand "matmul (2, 3, 4): 24 FLOPs, by hand
  48", test_the_probe_counts_its_flops "the probe says 262144 FLOPs a call, torch counts 524288" (and 105
  against 210 for the op probe), test_the_peak_probe_is_compute_bound;
* the matmul's bytes without writing C -> "matmul (2, 3, 4): 72 bytes, by hand 104", and the roof's seconds;
* the all-reduce's bytes counted once, not 2(G−1)/G -> "all_reduce (8, 4): 24.0 bytes, by hand 48.0" and
  test_the_all_reduce_on_the_networks_roof "roofline 1.2288e-05 s, chapter 01's ring 2.4576e-05 s";
* the thread count left changed -> test_threads_are_restored "1 thread(s) after the probe, 2 before".
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from coursekit.measure.roofline import (COURSE_OPS, Roofline, intensity_of, matmul_probe, measure_bandwidth,
                                        measure_op, measure_peak, network_roofline, op_probe)
from coursekit.netsim import Network, closed_form_time


def test_the_roof_by_hand():
    roof = Roofline(peak=200e9, bandwidth=10e9)
    assert roof.ridge == 20.0, f"ridge {roof.ridge}, by hand 200e9 / 10e9 = 20"
    assert roof.attainable(5) == 5e10, f"attainable(5) = {roof.attainable(5)}, by hand min(200e9, 5 × 10e9) = 5e10"
    assert roof.attainable(20) == roof.attainable(1000) == 200e9, "at and beyond the ridge: the peak"
    assert (roof.bound(19.9), roof.bound(20)) == ("memory", "compute")
    matmul = intensity_of("matmul", (2, 3, 4))
    assert roof.seconds(matmul) == max(48 / 200e9, 104 / 10e9)


def test_ops_by_hand():
    """FLOPs and bytes (fp32, 4 bytes), written out from the module's table."""
    by_hand = {("matmul", (2, 3, 4)): (2 * 2 * 3 * 4, (2 * 3 + 3 * 4 + 2 * 4) * 4),   # read A, B; write C
               ("layer_norm", (3, 5)): (8 * 15, (2 * 15 + 2 * 5) * 4),             # x, y; γ, β
               ("softmax", (3, 5)): (5 * 15, 2 * 15 * 4),
               ("add", (7,)): (7, 3 * 7 * 4),
               ("copy", (7,)): (0, 2 * 7 * 4),
               ("all_reduce", (8, 4)): (3 / 4 * 8, 2 * 3 / 4 * 8 * 4)}             # per rank, a ring
    for (op, shapes), (flops, size) in by_hand.items():
        got = intensity_of(op, shapes)
        assert got.flops == flops, f"{op} {shapes}: {got.flops} FLOPs, by hand {flops}"
        assert got.bytes == size, f"{op} {shapes}: {got.bytes} bytes, by hand {size}"
    assert intensity_of("all_reduce", (8, 4)).memory == "network"
    with pytest.raises(ValueError, match="unknown op"):
        intensity_of("conv", (1,))


@pytest.mark.parametrize("probe", [matmul_probe(64), op_probe("matmul", (5, 7, 3))], ids=["peak", "op"])
def test_the_probe_counts_its_flops(probe):
    """What the probe says a call does, against torch's FlopCounterMode (torch.utils.flop_counter: ``mm``
    counts ``2mkn``, docs.pytorch.org/docs/main/generated/torch.utils.flop_counter.FlopCounterMode.html)."""
    with FlopCounterMode(display=False) as counter:
        probe.run()
    assert probe.flops == counter.get_total_flops(), (f"the probe says {probe.flops} FLOPs a call, torch counts "
                                                      f"{counter.get_total_flops()}")


def test_the_all_reduce_on_the_networks_roof():
    """A ring all-reduce of n elements over G ranks on a link of B bytes/s: chapter 01's closed form without
    latency, 2(G−1) steps of n/G elements, is the roofline's bytes / B."""
    network, n, group = Network(bandwidth=1e9, latency=0.0), 2**12, 4
    roof = network_roofline(peak=1e12, network=network)
    modelled = roof.seconds(intensity_of("all_reduce", (n, group)))
    ring = closed_form_time("ring", group, n, network)
    assert modelled == pytest.approx(ring), f"roofline {modelled} s, chapter 01's ring {ring} s"
    assert roof.bound(intensity_of("all_reduce", (n, group))) == "memory"


def test_the_network_roof_takes_the_links_bandwidth():
    network = Network(bandwidth=25e9, latency=1e-5, gpus_per_node=8, intra_bandwidth=300e9)
    assert network_roofline(1e15, network).bandwidth == 25e9
    assert network_roofline(1e15, network, link="intra").bandwidth == 300e9


def test_the_probes_run_in_quick_mode():
    peak, bandwidth = measure_peak(quick=True), measure_bandwidth(quick=True)
    for name, value in (("peak", peak), ("bandwidth", bandwidth)):
        assert value > 0 and math.isfinite(value), f"{name}: {value}"


def test_the_peak_probe_is_compute_bound():
    """n = 2,048 (and the quick 256) are far right of any CPU's ridge (tens of FLOP/byte)."""
    assert intensity_of("matmul", (256, 256, 256)).value > 40


@pytest.mark.parametrize("label, op, shapes", COURSE_OPS[:6], ids=[label for label, _, _ in COURSE_OPS[:6]])
def test_the_course_ops_are_measured(label, op, shapes):
    measured = measure_op(op, shapes, repeats=2)
    assert measured.seconds > 0 and math.isfinite(measured.flops_per_second), label


def test_an_all_reduce_is_not_timed_here():
    with pytest.raises(ValueError, match="netsim.calibrate"):
        measure_op("all_reduce", (1024, 2))


def test_threads_are_restored():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        measure_peak(threads=1, quick=True, repeats=1)
        assert torch.get_num_threads() == 2, f"{torch.get_num_threads()} thread(s) after the probe, 2 before"
    finally:
        torch.set_num_threads(before)
