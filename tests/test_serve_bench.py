"""`seqexport bench-serve` end to end on a tiny model: every mode does the same work (the
token counts come from the requests, not from the timings)."""

import json

from click.testing import CliRunner

from seqexport.cli import cli


def test_bench_serve_runs_the_three_modes_on_the_same_requests(mamba_exports, tmp_path):
    _, folder = mamba_exports("loop")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench-serve", str(folder), "--clients", "1", "--clients", "3",
                                      "--requests", "7", "--max-tokens", "5", "--threads", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    total = data["one_at_a_time"]["tokens"]
    assert 7 * 1 <= total <= 7 * 5  # each request asked for 1 to 5 tokens
    for clients in ("1", "3"):
        row = data["rows"][clients]
        assert row["continuous"]["tokens"] == row["static"]["tokens"] == total
        assert row["speedup_vs_one_at_a_time"] > 0
    assert "continuous" in result.stdout and "one at a time" in result.stdout


def test_bench_serve_over_http_counts_the_streamed_tokens(mamba_exports, tmp_path):
    _, folder = mamba_exports("loop")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench-serve", str(folder), "--clients", "2", "--requests", "4",
                                      "--max-tokens", "3", "--threads", "1", "--http", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "over HTTP" in result.stdout
    data = json.loads(out.read_text())
    assert data["rows"]["2"]["continuous"]["tokens"] == data["one_at_a_time"]["tokens"]  # every SSE token seen
