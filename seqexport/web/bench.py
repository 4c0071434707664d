"""Per-token time in the browser (onnxruntime-web, WASM) beside the Python runtime's, same machine.

    python -m seqexport.web.bench exported/transformer-dates exported/mamba-dates [--prompts 20]

Builds a site for the exports (a temporary folder), serves it on 127.0.0.1 with the headers
that make the page cross-origin isolated (a clock finer than the 0.1 ms it has otherwise; WASM
threads allowed, --threads of them), and decodes the held-out date prompts in headless
Chromium, then with `seqexport.runtime` (onnxruntime CPU, --threads threads), the same prompts
and tokens: each run makes --tokens tokens, eos ignored.

Per-token time is the interval between consecutive tokens (the pick, then the step that feeds
the token back; in the page also its DOM update): the median and the mean over every token
after the first, and the page's ONNX Runtime run alone; the first token's time (the prompt's
prefill or encoder, then the pick) is reported apart, as a median.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from seqexport.web import browser
from seqexport.web.site import build_site


def python_times(folder, prompts, tokens: int, threads: int) -> tuple[list[float], list[float]]:
    """(first-token ms, later per-token ms) of the Python runtime on these prompts."""
    import seqexport.runtime as rt

    model = rt.load(folder, provider="cpu", threads=threads)
    firsts, rest = [], []
    options = rt.SearchOptions(max_new_tokens=tokens, eos_id=-1)
    for warm in (True, False):
        for p in prompts:
            ids = model.encode(p)
            stamps = [time.perf_counter()]
            rt.generate(model, [ids], options, on_token=lambda _, stamps=stamps: stamps.append(time.perf_counter()))
            ms = [1000 * (b - a) for a, b in zip(stamps, stamps[1:])]
            if not warm:
                firsts.append(ms[0])
                rest += ms[1:]
    return firsts, rest


def page_times(driver, url, name, prompts, tokens: int, threads: int) -> tuple[list[float], list[float], list[float], str]:
    """(first-token ms, later per-token ms, their ONNX Runtime runs alone, the backend) in the page."""
    if browser.open_page(driver, url, name, backend="wasm", threads=threads) != "ready":
        raise RuntimeError(f"{name}: the page did not load the model")
    firsts, rest, runs = [], [], []
    for warm in (True, False):
        for p in prompts:
            run = browser.run_prompt(driver, p, maxNewTokens=tokens, stopAtEos=False)
            if run["state"] != "done":
                raise RuntimeError(f"{name}: {run['message']}")
            if not warm:
                firsts.append(run["run"]["ms"][0])
                rest += run["run"]["ms"][1:]
                runs += run["run"]["runMs"][1:]
    return firsts, rest, runs, driver.find_element("id", "status").text


def main(argv=None) -> int:
    from seqexport.training.dates import make_split

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+", help="exported folders")
    ap.add_argument("--prompts", type=int, default=20, help="held-out date prompts per model [20]")
    ap.add_argument("--tokens", type=int, default=48, help="tokens each run makes (eos ignored) [48]")
    ap.add_argument("--threads", type=int, default=1, help="threads of the page's WASM and of Python's ORT [1]")
    args = ap.parse_args(argv)
    why = browser.browser_missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    prompts = [x for x, _ in make_split("test", args.prompts, seed=0)]
    med, mean = statistics.median, statistics.fmean
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        site = build_site(args.folders, Path(tmp) / "site", webgpu=False)
        names = [m["name"] for m in site["models"]]
        with browser.serve(Path(tmp) / "site", browser.ISOLATED) as url, browser.chromium() as driver:
            pages = {n: page_times(driver, url, n, prompts, args.tokens, args.threads) for n in names}
        for folder, name in zip(args.folders, names):
            first, rest, runs, status = pages[name]
            py_first, py_rest = python_times(folder, prompts, args.tokens, args.threads)
            rows.append((name, status.split(" · ")[-1], med(rest), mean(rest), med(runs), med(first),
                         med(py_rest), mean(py_rest), med(py_first)))
    b = site["bytes"]
    print(f"\n{args.prompts} held-out prompts x {args.tokens} tokens per model, {args.threads} thread(s); "
          "ms per token: median (mean)\n")
    print("| model | page backend | page | of which ORT run | Python ORT CPU | page / Python "
          "| first token: page | Python |")
    print("|---|---|---|---|---|---|---|---|")
    for name, backend, page, page_mean, run, first, py, py_mean, py_first in rows:
        print(f"| {name} | {backend} | {page:.3f} ({page_mean:.3f}) | {run:.3f} | {py:.3f} ({py_mean:.3f}) "
              f"| {page / py:.2f}x | {first:.2f} | {py_first:.2f} |")
    sizes = ", ".join(f"{m['name']} {m['bytes'] / 1e6:.1f} MB" for m in site["models"])
    print(f"\nsite: runtime (WASM) {b['runtime_wasm'] / 1e6:.1f} MB, models {b['models'] / 1e6:.1f} MB ({sizes}), "
          f"{b['total'] / 1e6:.1f} MB in all without the WebGPU build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
