"""python -m coursekit.bench sequence: the longest sequence under a cap is right for peaks whose law is known,
and a quick run prints every method on real ranks."""

from coursekit.bench.sequence import longest_under, main


def test_longest_under_a_cap_solves_the_fitted_law():
    """Quadratic peaks 100 + 2S + S²/2 reach 1450 at S = 50; linear peaks 10 + 3S reach 310 at S = 100.
    Planted bug, seen failing: the other root of the quadratic (2(cap - a)/(b - √…): -54 for 50)."""
    lengths = [10, 20, 40]
    assert abs(longest_under(1450, lengths, [100 + 2 * s + s * s / 2 for s in lengths]) - 50) < 1e-6
    assert abs(longest_under(310, lengths, [10 + 3 * s for s in lengths]) - 100) < 1e-6


def test_a_quick_run_prints_every_method_and_measures_a_peak(capsys):
    targets = main(["--seq", "32", "64", "--ranks", "2", "--repeats", "1", "--heads", "2"])
    out = capsys.readouterr().out
    for method in ("full", "full, fused kernel", "ring contiguous", "ring zig-zag", "ring zig-zag, fused", "all-to-all"):
        assert f"| {method} | " in out, method
    assert "longest sequence under 64 MiB per rank" in out and "nan" not in out
    assert targets == []  # the zig-zag target is measured at G >= 4 only, the fused ring's at S >= 2048
