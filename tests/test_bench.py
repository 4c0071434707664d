"""`seqexport bench`, the scaling measurement and the lowering study in fast mode on tiny
models: structure of the results; and the ratios made from medians, checked with medians
made by hand (a ratio turned upside down, or taken against the slower eager, fails)."""

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import seqexport.bench
import seqexport.bench.run as bench_run
import seqexport.bench.scaling as bench_scaling
import seqexport.families
import seqexport.runtime
from seqexport.bench.run import _ms, format_table, run_bench
from seqexport.bench.scaling import measure_scaling
from seqexport.bench.timing import duration, median_ratio, time_eager_and_ort, time_paired
from seqexport.cli import cli
from seqexport.errors import UsageError
from seqexport.families.mamba.lowering_study import format_rows, study, study_scan
from tests.conftest import UNROLLED_LEN

COMMON = {"folder", "family", "dtype", "provider", "threads", "versions", "machine", "load_seconds",
          "session_rss_bytes", "peak_rss_bytes", "bandwidth", "step_weights", "steps", "prefills",
          "generation", "notes", "artifact", "rss_after_load_bytes", "rss_after_run_bytes"}
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
    assert _positive(result["rss_after_load_bytes"]) and _positive(result["rss_after_run_bytes"])
    a = result["artifact"]
    folder = Path(result["folder"])
    assert a["shared_weights"] and a["weights_file_bytes"] == (folder / "weights.onnx.data").stat().st_size
    assert a["total_bytes"] == sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert _positive(a["export_seconds"]) and "on disk:" in format_table(result)


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
    # the GEMV floor: the step's linears alone, beside the bound
    sw = result["step_weights"]
    assert _positive(result["linears_only_ms"])
    assert sw["linears_only_over_bound"] == pytest.approx(result["linears_only_ms"] / sw["bound_ms"])
    assert "the step's linears alone" in format_table(result)


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
                                             "ort_over_eager_lowering", "ort_all_ms", "ort_all_over_eager"))
    # the weights file holds each weight once: its bytes are the model's (plus small derived constants)
    ckpt, _ = mamba_exports("loop")
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in ckpt.model.state_dict().values()}
    assert result["artifact"]["model_weight_bytes"] == sum(unique.values())
    assert result["artifact"]["weights_file_bytes"] <= 1.1 * sum(unique.values())
    # the state does not grow with the context
    assert len(set(result["state_bytes"].values())) == 1


def test_unrolled_prefill_only_at_its_length(mamba_exports):
    _, folder = mamba_exports("unrolled")
    result = run_bench(folder, provider="cpu", fast=True, contexts=(4,))
    assert [p["length"] for p in result["prefills"]] == [UNROLLED_LEN]
    assert any("unrolled" in n for n in result["notes"])


def test_rwkv_fast(rwkv_tiny):
    ckpt, folder = rwkv_tiny
    result = run_bench(folder, provider="cpu", fast=True, contexts=(3, 17))
    _check_common(result, "rwkv")
    assert [s["batch"] for s in result["steps"]] == [1]
    assert [p["length"] for p in result["prefills"]] == [3, 17]
    assert {p["lowering"] for p in result["prefills"]} == {"scan"}
    # per layer two token shifts (c) and a WKV matrix per head (h, n, n), float32, at any context
    cfg = ckpt.config
    assert set(result["state_bytes"].values()) == {cfg.n_layer * (2 * cfg.n_embd + cfg.n_head * cfg.head_size**2) * 4}


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
def test_prefill_cases_compute_what_their_columns_name(family, mamba_exports, request):
    """Against the eager full forward (`eager`): the runtime's prefill as generation runs it and
    the bare session give the last position's logits, `ort_all` every position's."""
    ckpt, folder = mamba_exports("loop") if family == "mamba" else request.getfixturevalue("rwkv_tiny")
    model = ckpt.model.float().eval()
    runtime = seqexport.runtime.load(folder, provider="cpu", threads=1)
    bench = seqexport.families.get(family).bench
    (case,) = bench.prefill_cases(runtime, model, (2,), (19,), np.random.default_rng(0), [])
    full = case.fns["eager"]()[0].detach().numpy()  # (b, 19, v)
    assert full.shape[:2] == (2, 19)
    for name, want in (("ort", full[:, -1:]), ("ort_session", full[:, -1:]), ("ort_all", full)):
        got = np.asarray(case.fns[name]()[0])
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=name)


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
    result = measure_scaling(folders, contexts=(4, 100), providers=["cpu"], repeats=1, bandwidth_mb=16,
                             allow_busy=True)  # CI runs tests side by side
    by = {m["label"]: m for m in result["models"]}
    assert [p["context"] for p in by["t"]["points"]] == [4, 100]
    assert all(_positive(p["step_ms"]) for m in by.values() for p in m["points"])
    # the KV cache grows with the context (its buffer by 16-slot grains); the recurrent state does not
    t, m = ([p["state_bytes"] for p in by[k]["points"]] for k in ("t", "m"))
    assert t[0] < t[1] and m[0] == m[1]
    assert all(_positive(m["bound_ms"]) for m in result["models"])
    for m in result["models"]:  # what the artifact costs: on disk, to load
        assert _positive(m["load_seconds"]) and isinstance(m["rss_added_by_load_bytes"], int)
        assert m["artifact"]["total_bytes"] == sum(f.stat().st_size for f in Path(m["folder"]).rglob("*")
                                                   if f.is_file())
    with pytest.raises(UsageError, match="positional table"):
        measure_scaling({"t": transformer_tiny[1]}, contexts=(100_000,), providers=["cpu"], allow_busy=True)


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


# --- ratios from known medians ------------------------------------------------------------------


def test_step_ratios_use_the_faster_eager():
    """eager 4 ms at n threads, 2 ms at 1 thread, ORT 1 ms: ORT ÷ eager is 1 / 2."""
    med = {"eager": 4e-3, "eager_1t": 2e-3, "eager_best": 2e-3, "ort": 1e-3, "ort_session": 0.5e-3,
           "eager_lowering": 8e-3, "eager_lowering_1t": 16e-3, "eager_lowering_best": 8e-3}
    out = _ms(med)
    assert out["eager_ms"] == pytest.approx(4.0) and out["eager_1t_ms"] == pytest.approx(2.0)
    assert out["ort_ms"] == pytest.approx(1.0) and out["ort_session_ms"] == pytest.approx(0.5)
    assert out["ort_over_eager"] == pytest.approx(0.5)
    assert out["ort_session_over_eager"] == pytest.approx(0.25)
    assert out["ort_over_eager_lowering"] == pytest.approx(1 / 8)  # its own best: 8 ms at n threads


def test_best_eager_is_the_faster_of_the_two_thread_counts():
    """Real timing of functions whose cost is known: sleeps that depend on torch's thread count."""
    def eager():  # 40 ms at 2 threads, 20 ms at 1
        time.sleep(0.04 if torch.get_num_threads() > 1 else 0.02)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        med = time_eager_and_ort({"eager": eager, "ort": lambda: time.sleep(0.01),
                                  "ort_session": lambda: time.sleep(0.005)}, threads=2, repeats=3, sample_s=0.0)
    finally:
        torch.set_num_threads(before)
    assert med["eager"] == pytest.approx(0.04, abs=0.008)
    assert med["eager_1t"] == pytest.approx(0.02, abs=0.008)
    assert med["eager_best"] == med["eager_1t"]
    assert _ms(med)["ort_over_eager"] == pytest.approx(0.5, abs=0.12)  # upside down: 2; the slower eager: 0.25


def _seconds(text: str) -> float:
    """'0.4 s', '42 s', '3 min 5 s' -> seconds."""
    m = re.fullmatch(r"(?:(\d+) min )?([\d.]+) s", text)
    return 60 * int(m[1] or 0) + float(m[2])


def test_slow_timing_reports_progress_and_quick_timing_is_quiet():
    """A call of 0.3 s with the thresholds at 0.1 s (beats) and 0.2 s (slow): its warm-up beats
    while it runs, the rounds' time is estimated from it (4 rounds of 0.3 s beside a quick
    function: 1.2 s), and every round says what is left, down to nothing. The quick function
    and a run without a log say nothing (and start no thread). A slow warm-up says what it took."""
    import threading

    lines: list[tuple[float, str]] = []
    start = time.perf_counter()
    fns = {"slow": lambda: time.sleep(0.3), "quick": lambda: None}
    time_paired(fns, 4, 0.0, log=lambda m: lines.append((time.perf_counter() - start, m)),
                heartbeat_s=0.1, slow_call_s=0.2)
    text = [m for _, m in lines]
    beats = [m for m in text if m.startswith("    slow (warm-up): still running after ")]
    assert len(beats) >= 3  # two warm-up calls of 0.3 s: ~5 beats
    (warm,) = [m for m in text if m.startswith("    slow: ") and m.endswith(" a call (warm-up)")]
    assert 0.25 <= _seconds(warm.removeprefix("    slow: ").removesuffix(" a call (warm-up)")) <= 0.5
    (estimate,) = [m for m in text if m.startswith("    timing slow, quick: about ")]
    assert re.fullmatch(r"    timing slow, quick: about (.+) more \(4 rounds\)", estimate)
    assert 1.0 <= _seconds(estimate.split("about ")[1].split(" more")[0]) <= 1.6
    rounds = [m for m in text if re.match(r"    slow: round \d of 4 took ", m)]
    assert [int(m.split("round ")[1][0]) for m in rounds] == [1, 2, 3, 4]
    lefts = [_seconds(m.split("about ")[1].removesuffix(" left")) for m in rounds]
    assert lefts == sorted(lefts, reverse=True) and lefts[-1] == 0.0 and 0.7 <= lefts[0] <= 1.1
    assert not [m for m in text if "quick" in m and m is not estimate]
    assert text.index(beats[-1]) < text.index(warm) < text.index(estimate) and text.index(estimate) < text.index(rounds[0])

    # a budget of 0.5 s: calls of 0.2 s stop after 3 rounds (0.6 s), not 7, and the estimate says so
    budget: list[str] = []
    time_paired({"slow": lambda: time.sleep(0.2)}, 7, 0.0, budget_s=0.5, log=budget.append, heartbeat_s=10.0,
                slow_call_s=0.15)
    assert budget[1].endswith("more (3 rounds)") and budget[-1].startswith("    slow: round 3 of 3 took ")
    assert len([m for m in budget if " round " in m]) == 3

    quiet: list[str] = []
    threads = threading.active_count()
    time_paired({"quick": lambda: None}, 3, 0.0, log=quiet.append, heartbeat_s=0.1, slow_call_s=0.2)
    time_paired(fns, 2, 0.0, heartbeat_s=0.05, slow_call_s=0.01)  # no log: nothing to say it with
    assert quiet == [] and threading.active_count() == threads


def test_duration_words():
    assert [duration(s) for s in (0.04, 9.9, 42.4, 185, 4812)] == ["0.0 s", "9.9 s", "42 s", "3 min 5 s",
                                                                   "1 h 20 min"]


def test_median_ratio_pairs_rounds():
    """Per-round ratios 0.5, 0.25, 0.125, 9: median 0.375 (not 1 / their inverse's median, 1 / 3,
    nor the ratio of the medians, 1 / 3)."""
    assert median_ratio([1.0, 1.0, 1.0, 9.0], [2.0, 4.0, 8.0, 1.0]) == pytest.approx(0.375)
    with pytest.raises(ValueError):
        median_ratio([1.0, 2.0], [1.0])


def _tiny_step_weight_bytes(c: dict) -> int:
    """The weights one decoder step reads, counted from the shape: per layer the self-attention
    (4 linears + norm), the cross-attention's W_q and fc (its K/V are cached) + norm, the
    feed-forward (2 linears + norm); then fc_out. float32."""
    d, f, v = c["d_model"], c["d_ff"], c["tgt_vocab_size"]
    lin = lambda i, o: i * o + o  # noqa: E731
    layer = 4 * lin(d, d) + 2 * d + 2 * lin(d, d) + 2 * d + lin(d, f) + lin(f, d) + 2 * d
    return (c["num_layers"] * layer + lin(d, v)) * 4


# medians by function name (seconds): steps, then generation ("eager_cache" present)
STEP_MED = {"eager": 4e-3, "eager_1t": 2e-3, "ort": 1e-3, "ort_session": 0.5e-3, "ort_branch": 3e-3}
GEN_MED = {"eager_cache": 0.08, "eager_cache_1t": 0.1, "eager_nocache": 0.4, "eager_nocache_1t": 0.2,
           "ort": 0.02}
BANDWIDTH = {"bytes": 64 << 20, "torch_threads": 2, "numpy_gbs": 5.0, "torch_1t_gbs": 8.0, "torch_gbs": 10.0,
             "gbs": 10.0}


def test_run_bench_ratios_from_known_medians(transformer_tiny, monkeypatch):
    """run_bench with the timer and the bandwidth replaced by known figures: every function
    still runs once (real engines); each ratio is checked against the figures by hand."""
    def known_medians(fns, threads, repeats, sample_s, log=None):
        table = GEN_MED if "eager_cache" in fns else STEP_MED
        out = {}
        for name, fn in fns.items():
            fn()
            out[name] = table[name]
            if name.startswith("eager"):  # what time_eager_and_ort returns
                out[name + "_1t"] = table[name + "_1t"]
                out[name + "_best"] = min(table[name], table[name + "_1t"])
        return out

    monkeypatch.setattr(bench_run, "time_eager_and_ort", known_medians)
    monkeypatch.setattr(bench_run, "measure_bandwidth", lambda *a, **k: dict(BANDWIDTH))
    ckpt, folder = transformer_tiny
    result = run_bench(folder, provider="cpu", batches=(1, 2), fast=True)
    weights = _tiny_step_weight_bytes(ckpt.config.to_dict())
    assert result["step_weights"]["bytes"] == weights
    bound_ms = weights / 10e9 * 1e3  # bytes ÷ 10 GB/s, in ms
    assert result["step_weights"]["bound_ms"] == pytest.approx(bound_ms)
    assert result["steps"]
    for row in result["steps"]:
        assert row["ort_over_eager"] == pytest.approx(0.5)  # 1 ms ÷ the 1-thread 2 ms
        assert row["ort_session_over_eager"] == pytest.approx(0.25)
        assert row["eager_best_ms"] == pytest.approx(2.0)
        assert row["bound_ms"] == pytest.approx(bound_ms)
        assert row["ort_over_bound"] == pytest.approx(1.0 / bound_ms)
        assert row["ort_session_over_bound"] == pytest.approx(0.5 / bound_ms)
        assert row["branch_over_step"] == pytest.approx(3.0)  # a branch's 3 ms ÷ the advancing step's 1
        # a step reads the valid self K/V and the cross K/V once (the cache is appended in place):
        # per layer 2 tensors of (batch, heads, length, head_dim) float32; plus mask and lengths
        c, b, src = ckpt.config, row["batch"], 8  # --fast: 8-token sources
        per_slot = c.num_layers * 2 * b * c.n_heads * c.head_dim * 4
        moved = per_slot * (row["context"] + src) + b * src * 8 + b * 8
        assert row["bound_with_state_ms"] == pytest.approx((weights + moved) / 10e9 * 1e3)
    for row in result["generation"]:
        made = row["batch"] * row["new_tokens"]
        assert row["ort_tps"] == pytest.approx(made / 0.02)
        assert row["eager_cache_tps"] == pytest.approx(made / 0.08)
        assert row["eager_nocache_1t_tps"] == pytest.approx(made / 0.2)
        # tokens/s ratios: ORT makes 4x the tokens of the faster cached eager (0.08 s at n threads),
        # 10x those of the faster uncached eager (0.2 s at 1 thread)
        assert row["ort_over_eager_cache"] == pytest.approx(4.0)
        assert row["ort_over_eager_nocache"] == pytest.approx(10.0)


def test_scaling_bound_from_known_bandwidth(transformer_tiny, monkeypatch):
    monkeypatch.setattr(bench_scaling, "measure_bandwidth", lambda *a, **k: dict(BANDWIDTH))
    ckpt, folder = transformer_tiny
    result = measure_scaling({"t": folder}, contexts=(4,), providers=["cpu"], repeats=1, allow_busy=True)
    (m,) = result["models"]
    weights = _tiny_step_weight_bytes(ckpt.config.to_dict())
    assert m["step_weight_bytes"] == weights
    assert m["bound_ms"] == pytest.approx(weights / 10e9 * 1e3)


def test_scaling_study_refuses_a_busy_machine(transformer_tiny, monkeypatch):
    """Timings taken while other work holds the cores measure that work (the committed plot once
    showed a 5-9 ms step as 45 ms): the study refuses, or with allow_busy warns."""
    import os

    from seqexport.bench.scaling import check_quiet

    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cores, 0.0, 0.0))
    with pytest.raises(UsageError, match=r"busy: load average .* on \d+ cores"):
        measure_scaling({"t": transformer_tiny[1]}, contexts=(4,), providers=["cpu"])
    said = []
    assert check_quiet(allow_busy=True, log=said.append) == 4.0 * cores
    assert said and said[0].startswith("warning: the machine is busy")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1 * cores, 0.0, 0.0))
    assert check_quiet() == 0.1 * cores


def test_scaling_rounds_merge_to_medians(transformer_tiny, monkeypatch):
    """Three real rounds of the study on one folder (the step times replaced by known ones, so the
    median can be read): each point is the median of its rounds, the bound follows the median
    bandwidth, and rounds of different contexts are refused."""
    from seqexport.bench.scaling import merge_rounds

    monkeypatch.setattr(bench_scaling, "measure_bandwidth", lambda *a, **k: dict(BANDWIDTH))
    folder = transformer_tiny[1]
    rounds = [measure_scaling({"t": folder}, contexts=(4, 8), providers=["cpu"], repeats=1, allow_busy=True)
              for _ in range(3)]
    for r, (ms, gbs) in zip(rounds, [(3.0, 10.0), (1.0, 30.0), (2.0, 20.0)], strict=True):
        r["bandwidth_gbs"] = gbs
        for i, p in enumerate(r["models"][0]["points"]):
            p["step_ms"] = ms + 10 * i
    merged = merge_rounds(rounds)
    (m,) = merged["models"]
    assert [p["step_ms"] for p in m["points"]] == [2.0, 12.0]
    assert m["points"][0]["step_ms_rounds"] == [3.0, 1.0, 2.0]
    assert merged["bandwidth_gbs"] == 20.0 and merged["rounds"] == 3
    assert m["bound_ms"] == pytest.approx(m["step_weight_bytes"] / 20e9 * 1e3)
    rounds[1]["models"][0]["points"].pop()
    with pytest.raises(UsageError, match="different models or contexts"):
        merge_rounds(rounds)

