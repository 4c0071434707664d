"""`compare`, the parity verdict: the pass rule |got - ref| <= atol + rtol * |ref| at its
boundary (computed here), non-finite values, shapes, and the statistics it reports."""

import numpy as np
import pytest

from seqexport.parity.compare import compare

# Powers of two: every sum and product below is exact in float64, so the boundary is exact.
ATOL, RTOL = 0.25, 0.125
REF = np.array([1.0, -2.0, 4.0, 0.0, -8.0])
BOUND = ATOL + RTOL * np.abs(REF)  # per element: 0.375, 0.5, 0.75, 0.25, 1.25


def test_equal_arrays_pass_with_zero_error():
    c = compare("x", REF.copy(), REF, ATOL, RTOL)
    assert c.passed and bool(c)
    assert (c.max_abs, c.max_rel, c.mean_abs, c.needed_atol, c.nonfinite) == (0.0, 0.0, 0.0, 0.0, 0)
    assert c.shape == (5,) and c.name == "x"


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_bound_itself_passes(sign):
    got = REF + sign * BOUND  # every element exactly on its bound
    assert compare("x", got, REF, ATOL, RTOL).passed


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("i", range(len(REF)))
def test_just_outside_the_bound_fails(sign, i):
    got = REF.copy()
    got[i] = REF[i] + sign * BOUND[i] * (1 + 1e-9)  # one element just past its bound
    c = compare("x", got, REF, ATOL, RTOL)
    assert not c.passed and not bool(c)
    assert c.nonfinite == 0
    assert c.max_abs == pytest.approx(BOUND[i] * (1 + 1e-9), rel=1e-12)


def test_relative_part_scales_with_the_reference_not_the_output():
    """ref 4, got 4.76: |diff| 0.76 > 0.25 + 0.125 * 4 = 0.75 fails; scaled by |got| (0.845) it would pass."""
    assert not compare("x", [4.76], [4.0], ATOL, RTOL).passed
    assert compare("x", [4.74], [4.0], ATOL, RTOL).passed


def test_atol_and_rtol_each_matter():
    ref = np.array([10.0])
    assert compare("x", ref + 1.0, ref, atol=0.0, rtol=0.1).passed  # 1.0 <= 0 + 0.1 * 10
    assert not compare("x", ref + 1.0, ref, atol=0.0, rtol=0.05).passed
    assert compare("x", ref + 1.0, ref, atol=1.0, rtol=0.0).passed
    assert not compare("x", ref + 1.0, ref, atol=0.5, rtol=0.0).passed


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf, in compare
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("side", ["got", "ref", "both"])
def test_nonfinite_fails_even_when_all_else_is_equal(bad, side):
    got, ref = REF.copy(), REF.copy()
    if side in ("got", "both"):
        got[2] = bad
    if side in ("ref", "both"):
        ref[2] = bad
    c = compare("x", got, ref, atol=1e6, rtol=1e6)  # any finite difference would pass
    assert not c.passed
    assert c.nonfinite == 1


def test_nonfinite_elements_are_counted_on_either_side():
    got, ref = REF.copy(), REF.copy()
    got[0], ref[3], got[4], ref[4] = np.nan, np.inf, -np.inf, np.nan
    c = compare("x", got, ref, ATOL, RTOL)
    assert not c.passed and c.nonfinite == 3  # elements 0, 3 and 4


def test_nonfinite_in_float32_and_float16_inputs():
    ref = np.ones((2, 3), np.float32)
    got = ref.astype(np.float16)
    got[1, 1] = np.float16(np.inf)
    c = compare("x", got, ref, 1.0, 1.0)
    assert not c.passed and c.nonfinite == 1


@pytest.mark.parametrize("got_shape, ref_shape", [((2, 3), (3, 2)), ((3,), (1, 3)), ((2, 3), (2, 4)),
                                                  ((1,), (4,)), ((0, 3), (3,))])
def test_shape_mismatch_fails(got_shape, ref_shape):
    got, ref = np.zeros(got_shape), np.zeros(ref_shape)  # equal values wherever they would broadcast
    c = compare("x", got, ref, atol=1e6, rtol=1e6)
    assert not c.passed and not bool(c)


def test_statistics_against_numpy():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(4, 7)) * 3
    got = ref + rng.normal(size=(4, 7)) * 1e-3
    c = compare("x", got.astype(np.float32), ref.astype(np.float32), 1e-4, 1e-3)
    g, r = got.astype(np.float32).astype(np.float64), ref.astype(np.float32).astype(np.float64)
    diff = np.abs(g - r)
    assert c.max_abs == pytest.approx(diff.max(), rel=1e-12)
    assert c.mean_abs == pytest.approx(diff.mean(), rel=1e-12)
    assert c.max_rel == pytest.approx((diff / np.abs(r)).max(), rel=1e-12)
    assert c.shape == (4, 7)
    assert c.passed == bool(np.all(diff <= 1e-4 + 1e-3 * np.abs(r)))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("rtol", [0.0, 1e-3, 0.05])
def test_needed_atol_is_the_smallest_atol_that_passes(seed, rtol):
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(3, 50)) * 10.0 ** rng.integers(-2, 3, size=(3, 50))
    got = ref + rng.normal(size=(3, 50)) * 0.01
    c = compare("x", got, ref, atol=0.0, rtol=rtol)
    expected = max(0.0, float(np.max(np.abs(got - ref) - rtol * np.abs(ref))))
    assert c.needed_atol == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert expected > 0  # rtol alone does not pass these
    assert compare("x", got, ref, atol=c.needed_atol, rtol=rtol).passed
    assert not compare("x", got, ref, atol=c.needed_atol * (1 - 1e-9), rtol=rtol).passed


def test_needed_atol_is_zero_when_rtol_suffices():
    ref = np.array([100.0, -50.0])
    c = compare("x", ref * 1.001, ref, atol=0.0, rtol=0.01)
    assert c.passed and c.needed_atol == 0.0


def test_to_dict_keeps_the_verdict():
    c = compare("logits", [1.0, np.nan], [1.0, 2.0], ATOL, RTOL)
    d = c.to_dict()
    assert d["passed"] is False and d["nonfinite"] == 1 and d["shape"] == [2] and d["name"] == "logits"
