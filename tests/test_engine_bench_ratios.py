"""bench-serve's ratios, each over its own base (no model: figures made up): generate() one at a
time in process for every mode, and each concurrent path over the same path at one client (an
HTTP path over one HTTP client, not over the in-process generate())."""

import pytest

from seqexport.bench.serve import _medians, _with_ratios, format_table


def figures(tokens_per_s, p50_ms):
    return {"tokens_per_s": tokens_per_s, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0, "token_p50_ms": p50_ms,
            "token_p99_ms": 3.0, "wall_s": 1.0, "tokens": 100}


def one_round(http_scale=1.0):
    one = figures(1000, 1.0)
    rows = {c: {"continuous": figures(1100 * c, 0.5 * c), "static": figures(900 * c, 0.4 * c),
                "http_no_ray": figures(300 * c * http_scale, 2.0 + c), "http_ray": figures(200 * c, 3.0 + c)}
            for c in (1, 16)}
    return _with_ratios(one, rows)


def test_each_path_is_measured_against_itself_at_one_client():
    row = one_round()["rows"][16]
    assert row["speedup_vs_one_at_a_time"] == pytest.approx(17.6)  # in process over generate()
    assert row["continuous_vs_one_client"] == pytest.approx(16)  # over the engine at one client
    assert row["http_no_ray_vs_one_at_a_time"] == pytest.approx(4.8)  # over generate(), named so
    assert row["http_no_ray_vs_one_client"] == pytest.approx(16)  # over one HTTP client
    assert row["http_ray_vs_one_client"] == pytest.approx(16)
    assert row["http_ray_token_p50_vs_one_client"] == pytest.approx(19 / 4)
    assert row["token_p50_vs_one_client"] == pytest.approx(16)  # the in-process p50 keeps its key


def test_without_a_one_client_run_there_is_no_same_path_ratio():
    result = _with_ratios(figures(1000, 1.0), {16: {"continuous": figures(4000, 2.0), "static": figures(3000, 2.0),
                                                     "http_ray": figures(1000, 4.0)}})
    row = result["rows"][16]
    assert "http_ray_vs_one_client" not in row and "continuous_vs_one_client" not in row
    assert row["http_ray_vs_one_at_a_time"] == pytest.approx(1.0)
    table = format_table({"family": "f", "folder": "d", "provider": "cpu", "threads": 1, "requests": 8,
                          "max_tokens": 8, "http": "all", **result})
    assert "vs generate() 1by1" in table and "vs 1 client, same" in table


def test_rounds_take_the_median_of_each_same_path_ratio():
    result = _medians([one_round(s) for s in (1.0, 2.0, 3.0)], (1, 16))
    row = result["rows"][16]
    assert row["http_no_ray_vs_one_client_rounds"] == pytest.approx([16, 16, 16])
    assert row["http_no_ray_vs_one_at_a_time_rounds"] == pytest.approx([4.8, 9.6, 14.4])
    table = format_table({"family": "f", "folder": "d", "provider": "cpu", "threads": 1, "requests": 8,
                          "max_tokens": 8, "http": "all", **result})
    assert "vs 1 HTTP client 16.00x 16.00x 16.00x" in table
