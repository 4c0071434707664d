"""`seqexport bench`, the scaling measurement and the lowering study in fast mode on tiny
models: structure of the results, no timings asserted."""

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import seqexport.bench
from seqexport.bench.lowering_study import format_rows, study, study_scan
from seqexport.bench.run import format_table, run_bench
from seqexport.bench.scaling import measure_scaling
from seqexport.cli import cli
from seqexport.errors import UsageError
from tests.conftest import UNROLLED_LEN

COMMON = {"folder", "family", "dtype", "provider", "threads", "versions", "machine", "load_seconds",
          "session_rss_bytes", "peak_rss_bytes", "bandwidth", "step_weights", "steps", "prefills",
          "generation", "notes"}
STEP = {"batch", "state_bytes", "eager_ms", "eager_1t_ms", "eager_best_ms", "ort_ms", "ort_session_ms",
        "ort_over_eager", "bound_ms", "bound_with_state_ms", "ort_over_bound"}
GENERATION = {"batch", "new_tokens", "eager_cache_tps", "eager_nocache_tps", "ort_tps",
              "ort_over_eager_cache", "ort_over_eager_nocache"}


def _positive(x) -> bool:
    return isinstance(x, float | int) and math.isfinite(x) and x > 0


def _check_common(result: dict, family: str):
    assert COMMON <= set(result)
    assert result["family"] == family
    assert result["provider"] == "CPUExecutionProvider"
    assert result["threads"] == {"torch": 2, "ort": 2}
    assert _positive(result["bandwidth"]["gbs"]) and _positive(result["step_weights"]["bytes"])
    for row in result["steps"]:
        assert STEP <= set(row)
        assert all(_positive(row[k]) for k in STEP - {"batch"})
    for row in result["generation"]:
        assert GENERATION <= set(row)
        assert all(_positive(row[k]) for k in GENERATION)
    json.dumps(result)  # JSON-serialisable as it is
    assert result["folder"] in format_table(result)


def test_transformer_fast(transformer_tiny):
    _, folder = transformer_tiny
    result = run_bench(folder, provider="cpu", batches=(1, 2), fast=True)
    _check_common(result, "transformer")
    assert [(s["batch"], s["context"]) for s in result["steps"]] == [(1, 4), (1, 16), (2, 4), (2, 16)]
    # the KV cache grows with the past length, and with the batch
    by = {(s["batch"], s["context"]): s["self_kv_bytes"] for s in result["steps"]}
    assert by[1, 4] < by[1, 16] < by[2, 16]
    assert result["prefills"] == []
    assert "decoder step" in format_table(result)


def test_mamba_fast_through_cli(mamba_exports, tmp_path):
    _, folder = mamba_exports("loop")
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(cli, ["bench", str(folder), "--provider", "cpu", "--fast", "--context", "3",
                                   "--context", "17", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "prefill" in res.output and "tokens/s" in res.output
    result = json.loads(out.read_text())
    _check_common(result, "mamba")
    assert [s["batch"] for s in result["steps"]] == [1]
    assert [p["length"] for p in result["prefills"]] == [3, 17]
    for p in result["prefills"]:
        assert p["lowering"] == "loop"
        assert all(_positive(p[k]) for k in ("eager_ms", "eager_lowering_ms", "ort_ms", "ort_over_eager",
                                             "ort_over_eager_lowering"))
    # the state does not grow with the context
    assert len(set(result["state_bytes"].values())) == 1


def test_unrolled_prefill_only_at_its_length(mamba_exports):
    _, folder = mamba_exports("unrolled")
    result = run_bench(folder, provider="cpu", fast=True, contexts=(4,))
    assert [p["length"] for p in result["prefills"]] == [UNROLLED_LEN]
    assert any("unrolled" in n for n in result["notes"])


def test_user_errors(transformer_tiny, tmp_path):
    _, folder = transformer_tiny
    with pytest.raises(UsageError, match="positional table"):
        run_bench(folder, provider="cpu", fast=True, contexts=(100_000,))
    with pytest.raises(UsageError, match="batches"):
        run_bench(folder, provider="cpu", fast=True, batches=())
    res = CliRunner().invoke(cli, ["bench", str(folder), "--fast", "--context", "100000"])
    assert res.exit_code == 2 and "error:" in res.output
    res = CliRunner().invoke(cli, ["bench", str(tmp_path / "missing"), "--fast"])
    assert res.exit_code == 2 and "error:" in res.output


def test_scaling_asks_the_family(transformer_tiny, mamba_exports):
    folders = {"t": transformer_tiny[1], "m": mamba_exports("loop")[1]}
    result = measure_scaling(folders, contexts=(4, 32), providers=["cpu"], repeats=1, bandwidth_mb=16)
    by = {m["label"]: m for m in result["models"]}
    assert [p["context"] for p in by["t"]["points"]] == [4, 32]
    assert all(_positive(p["step_ms"]) for m in by.values() for p in m["points"])
    # the KV cache grows with the context; the recurrent state does not
    t, m = ([p["state_bytes"] for p in by[k]["points"]] for k in ("t", "m"))
    assert t[0] < t[1] and m[0] == m[1]
    assert all(_positive(m["bound_ms"]) for m in result["models"])
    with pytest.raises(UsageError, match="positional table"):
        measure_scaling({"t": transformer_tiny[1]}, contexts=(100_000,), providers=["cpu"])


def test_lowering_study_both_framings():
    rows = study_scan(8, d_state=4, length=20, lowerings=("loop",), repeats=1)
    rows += study("tiny", length=20, lowerings=("loop",), repeats=1)
    assert [(r.get("preset"), r["lowering"]) for r in rows] == [(None, "loop"), ("tiny", "loop")]
    for r in rows:
        assert r["nodes"] > r["top_level_nodes"] > 0  # the Scan body is counted
        assert all(_positive(r[k]) for k in ("ort_ms", "eager_reference_ms", "eager_chunked_ms",
                                             "ort_over_reference", "ort_over_chunked"))
    assert "scan 8x4" in format_rows(rows)


def test_no_family_names_in_the_generic_bench():
    """What differs per family comes from its bench module, never from a name comparison."""
    for path in Path(seqexport.bench.__file__).parent.glob("*.py"):
        assert not re.search(r"family ?[!=]= ?['\"]", path.read_text()), path
