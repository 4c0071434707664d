"""`format_table`: the readable summary of a `run_bench` result. The family's bench module
names its step table and any family columns (`StepTable`); the rest is the same for all."""

from dataclasses import dataclass

from seqexport import families


@dataclass(frozen=True)
class StepTable:
    title: str  # the heading above the step rows
    columns: tuple[tuple[str, str], ...] = ()  # (heading, step row key) between batch and state MB


def _table(headers: list[str], rows: list[list]) -> list[str]:
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return [line(headers)] + [line(r) for r in cells]


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def _mb(b):
    return None if b is None else b / 1e6


def format_table(result: dict) -> str:
    """A readable summary of `run_bench`'s result."""
    r, bw, sw = result, result["bandwidth"], result["step_weights"]
    n = r["threads"]["torch"]
    lines = [
        f"{r['folder']}: {r['family']} ({r['preset'] or 'checkpoint'}, {r['dtype']}) on {r['provider']}, "
        f"threads torch {n} / ORT {r['threads']['ort']}, {r['repeats']} repeats (medians of single calls)",
        f"session load {r['load_seconds']:.3f} s, +{_cell(_mb(r['session_rss_bytes']))} MB RSS; "
        f"peak RSS {r['peak_rss_bytes'] / 1e6:.0f} MB; load average {r['machine']['load_average_start'][0]:.1f} "
        f"-> {r['machine']['load_average_end'][0]:.1f} on {r['machine']['cpus']} CPUs",
        f"memory read bandwidth {bw['gbs']:.1f} GB/s (sum of {bw['bytes'] / 2**20:.0f} MB: numpy {bw['numpy_gbs']:.1f}, "
        f"torch 1t {bw['torch_1t_gbs']:.1f}, {n}t {bw['torch_gbs']:.1f}); "
        f"weights read per step {sw['bytes'] / 1e6:.2f} MB -> bound {sw['bound_ms']:.3f} ms",
        f"ratios: ORT (runtime step) ÷ the faster eager of torch at {n} thread(s) and at 1",
    ]
    if "linears_only_ms" in r:
        lines.insert(-1, f"the step's linears alone (independent Gemms at batch 1, no other operator): "
                         f"{r['linears_only_ms']:.3f} ms, {sw['linears_only_over_bound']:.2f}x the weights' bound "
                         "(the floor ORT's GEMV sets)")
    if "artifact" in r:
        a = r["artifact"]
        share = f" ({a['graphs_and_weights_over_weights']:.3f}x the {a['model_weight_bytes'] / 1e6:.1f} MB of weights)" \
            if "model_weight_bytes" in a else ""
        lines.append(f"on disk: graphs {a['graph_bytes'] / 1e6:.1f} MB + weights {a['weights_file_bytes'] / 1e6:.1f} MB"
                     f"{' (one shared file)' if a['shared_weights'] else ''}{share}, checkpoint copy "
                     f"{a['checkpoint_bytes'] / 1e6:.1f} MB, folder {a['total_bytes'] / 1e6:.1f} MB; export took "
                     f"{_cell(a['export_seconds'])} s; RSS after load {_cell(_mb(r.get('rss_after_load_bytes')))} MB, "
                     f"after the runs {_cell(_mb(r.get('rss_after_run_bytes')))} MB")
    lines.append("")
    table: StepTable = families.get(r["family"]).bench.TABLE
    lines.append(table.title)
    # a model with an appended cache: the step from an earlier state (a branch) beside the advancing one
    branch = [("ORT branch", "ort_branch_ms"), ("branch/ORT", "branch_over_step")] \
        if any("ort_branch_ms" in s for s in r["steps"]) else []
    lines += _table(
        ["batch", *(h for h, _ in table.columns), "state MB", f"eager {n}t", "eager 1t", "ORT", *(h for h, _ in branch),
         "ORT bare", "ORT/eager", "bare/eager", "bound", "ORT/bound", "bound+state", "ORT/bound+state"],
        [[s["batch"], *(s[k] for _, k in table.columns), _mb(s["state_bytes"]), s["eager_ms"], s["eager_1t_ms"],
          s["ort_ms"], *(s.get(k) for _, k in branch), s["ort_session_ms"], s["ort_over_eager"],
          s["ort_session_over_eager"], s["bound_ms"], s["ort_over_bound"], s["bound_with_state_ms"],
          s["ort_over_bound_with_state"]] for s in r["steps"]])
    if branch:
        lines.append("(ORT: the runtime's step advancing a state it owns, the cache written in place; ORT branch: "
                     "the step from an earlier state, which copies the cache first)")
    if r["prefills"]:
        lines += ["", f"prefill, ms (ref: the sequential reference scan; {r['prefills'][0]['lowering']}: "
                      "the export's lowering run eagerly)"]
        lines.append("(ORT: the runtime's prefill as generation runs it, logits of the last position; ORT all: "
                     "every position's, as the eager forward computes them)")
        lines += _table(
            ["batch", "length", f"ref {n}t", "ref 1t", f"lowering {n}t", "lowering 1t", "ORT", "ORT all", "ORT bare",
             "ORT/ref", "all/ref", "ORT/lowering"],
            [[p["batch"], p["length"], p["eager_ms"], p["eager_1t_ms"], p["eager_lowering_ms"],
              p["eager_lowering_1t_ms"], p["ort_ms"], p.get("ort_all_ms"), p["ort_session_ms"], p["ort_over_eager"],
              p.get("ort_all_over_eager"), p["ort_over_eager_lowering"]] for p in r["prefills"]])
    lines += ["", "end-to-end greedy generation, tokens/s (no cache: the full forward over the prefix per token)"]
    lines += _table(
        ["batch", "prompt", "new", f"cache {n}t", "cache 1t", f"no cache {n}t", "no cache 1t", "ORT",
         "ORT/cache", "ORT/no cache"],
        [[g["batch"], g["prompt_len"], g["new_tokens"], g["eager_cache_tps"], g["eager_cache_1t_tps"],
          g["eager_nocache_tps"], g["eager_nocache_1t_tps"], g["ort_tps"], g["ort_over_eager_cache"],
          g["ort_over_eager_nocache"]] for g in r["generation"]])
    for note in r["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
