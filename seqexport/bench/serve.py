"""What `seqexport bench-serve` measures: the same requests served three ways, side by side in
one run, at each number of concurrent clients.

- continuous: the engine (continuous batching); each client submits a request, waits for it,
  submits the next (a closed loop), so `clients` requests are in flight at once;
- one at a time: each request alone through generate(), one after another;
- static: wait for a full batch of `clients` requests, run generate() on it to the end.

With `http`, "continuous" goes through a `seqexport serve --no-ray` subprocess instead:
each client streams its request over HTTP (SSE) and timestamps the chunks as they arrive.

Each request asks for its own number of tokens, between a quarter of `max_tokens` and all of
it (seeded; eos ignored), the same requests in every mode: static batches run to their longest
request (the tokens past a request's own count are not counted), continuous batching lets each
row leave when it is done.
Figures: tokens/s over the wall time; time to first token (request start -> its first
token; queueing included) and per-token latency (gap between a request's tokens), p50/p99;
for continuous batching in the engine, the batch's mean rows a step. Ratios, each over its own
base: tokens/s over generate() one at a time in process (every mode, HTTP ones included), and
each concurrent path's tokens/s and per-token p50 over the same path's at one client (when 1 is
among the client counts: an HTTP path over one HTTP client).

And the floor under the per-token latency: one batched decode step as the engine runs it
(`advance`, else `step`), alone, at one row and at the continuous run's mean rows, timed in
turn. A token at N clients comes a batch step apart, at one client a one-row step apart, so
their per-token p50s cannot differ by less than these steps do (plus what the engine adds).
"""

import threading
import time

import numpy as np

from seqexport.runtime.engine import Engine
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load


def bench_prompts(model, n: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 8-40 tokens: the date task's inputs for a model with a tokenizer, else random ids."""
    rng = np.random.default_rng(seed)
    if model.tokenizer is not None:
        words = ["Friday", "March", "5th", "2021", "12", "Oct", "1999", "Sunday", "the", "of", "July", "1 May 2003"]
        texts = [" ".join(rng.choice(words, int(rng.integers(2, 6)))) for _ in range(n)]
        return [model.encode(t) for t in texts]
    return [rng.integers(3, model.vocab_size, int(rng.integers(8, 41))).tolist() for _ in range(n)]


def _figures(wall: float, tokens: int, ttft: list[float], gaps: list[float]) -> dict:
    def q(xs, p):
        return float(np.percentile(xs, p) * 1e3) if xs else float("nan")

    return {"tokens_per_s": tokens / wall, "ttft_p50_ms": q(ttft, 50), "ttft_p99_ms": q(ttft, 99),
            "token_p50_ms": q(gaps, 50), "token_p99_ms": q(gaps, 99), "wall_s": wall, "tokens": tokens}


def continuous(engine: Engine, work, clients: int) -> dict:
    todo = iter(work)
    lock = threading.Lock()
    done = []

    def client():
        while True:
            with lock:
                item = next(todo, None)
            if item is None:
                return
            req = engine.submit(item[0], _options(item[1]))
            req.wait()
            done.append(req)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ttft = [r.token_times[0] - r.submitted for r in done]
    gaps = [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])]
    return _figures(wall, sum(len(r.tokens) for r in done), ttft, gaps) | \
        {"rows_per_step": engine.row_steps / max(engine.steps, 1)}


def step_floor(model, prompts: list[list[int]], rows: int, calls: int = 100, rounds: int = 3) -> dict:
    """Median ms of one batched decode step as the engine runs it (`advance` where the model
    has it, else `step`), alone, at 1 row and at `rows`, rounds taken in turn; a chain of steps
    from `begin` of that many prompts, begun again (untimed) before a positional table ends."""
    limit = model.max_new_tokens_limit
    advance = model.advance
    sizes = sorted({1, max(1, rows)})
    chains = {}

    def fresh(k: int) -> list:
        logits, state = model.begin([prompts[i % len(prompts)] for i in range(k)])  # (k, v)
        return [state, logits.argmax(-1), 1]  # state, tokens (k,), positions held

    times: dict[int, list[float]] = {k: [] for k in sizes}
    for _ in range(rounds):
        for k in sizes:
            chain = chains.get(k) or fresh(k)
            for _ in range(calls):
                if limit is not None and chain[2] >= limit - 1:
                    chain = fresh(k)
                t = time.perf_counter()
                if advance is not None:
                    _, chain[0] = advance(chain[1], chain[0], k)
                else:
                    _, chain[0] = model.step(chain[1], chain[0])
                times[k].append(time.perf_counter() - t)
                chain[2] += 1
            chains[k] = chain
    one, many = (float(np.median(times[k])) * 1e3 for k in (1, sizes[-1]))
    return {"rows": sizes[-1], "step_ms_1_row": one, "step_ms": many, "step_vs_1_row": many / one}


def over_http(url: str, work, clients: int) -> dict:
    """Closed-loop clients streaming completions from a server; times taken at the client."""
    import json

    import requests

    todo = iter(work)
    lock = threading.Lock()
    ttft, gaps, tokens = [], [], [0]

    def client():
        with requests.Session() as http:
            while True:
                with lock:
                    item = next(todo, None)
                if item is None:
                    return
                body = {"prompt": item[0], "max_tokens": item[1], "temperature": 0, "ignore_eos": True, "stream": True}
                sent = time.perf_counter()
                times = []
                with http.post(url + "/v1/completions", json=body, stream=True, timeout=600) as r:
                    r.raise_for_status()
                    pending = b""
                    for data in r.iter_content(chunk_size=None):  # as the bytes arrive
                        now = time.perf_counter()
                        *events, pending = (pending + data).split(b"\n\n")
                        for event in events:
                            if event.startswith(b"data: {"):
                                times += [now] * len(json.loads(event[6:])["choices"][0]["token_ids"])
                with lock:
                    ttft.append(times[0] - sent)
                    gaps.extend(b - a for a, b in zip(times, times[1:]))
                    tokens[0] += len(times)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _figures(time.perf_counter() - start, tokens[0], ttft, gaps)


def _options(n: int) -> SearchOptions:
    return SearchOptions(max_new_tokens=n, eos_id=-1)  # eos ignored: the asked-for work


def batched(model, work, batch: int) -> dict:
    """generate() on batches of `batch` requests, each run to its longest (batch 1: one at a time)."""
    ttft, gaps, tokens = [], [], 0
    start = time.perf_counter()
    for i in range(0, len(work), batch):
        group = work[i : i + batch]
        t0 = time.perf_counter()
        times: list[float] = []
        generate(model, [p for p, _ in group], _options(max(n for _, n in group)),
                 on_token=lambda _, times=times: times.append(time.perf_counter()))
        for _, n in group:  # a request has its tokens once the batch has made n of them
            tokens += n
            ttft.append(times[0] - t0)
            gaps += [b - a for a, b in zip(times[:n], times[1:n])]
    return _figures(time.perf_counter() - start, tokens, ttft, gaps)


HTTP_MODES = ("no-ray", "ray")  # `serve --no-ray`, and `serve`'s default: its embedded Ray Serve
HTTP_ALL = "all"  # in the engine, over HTTP without Ray and through Ray Serve, side by side


def _http_server(folder, mode: str, max_rows: int, n_requests: int, provider: str, threads: int | None,
                 engine_options: dict, work: list):
    """A started `serve` subprocess (`mode`: "no-ray", `--no-ray`; "ray", the embedded Ray Serve
    default, one replica) with the bench's engine options, warmed up."""
    from seqexport.serve.process import ServerProcess

    args = (["--no-ray"] if mode == "no-ray" else []) + [
        "--max-rows", str(max_rows), "--max-queue", str(max(n_requests, 1)),
        "--provider", provider] + (["--threads", str(threads)] if threads else [])
    for name in ("prefill_chunk", "start_batch"):
        if name in engine_options:
            args += ["--" + name.replace("_", "-"), str(engine_options[name])]
    if engine_options.get("pin_threads"):
        args.append("--pin-threads")
    server = ServerProcess(folder, *args, ready_timeout=180)
    server.start()
    try:
        over_http(server.url, work[:4], 1)  # warm up
    except BaseException:
        server.stop()
        raise
    return server


def _http_modes(http) -> tuple[str, ...]:
    """`http` as the HTTP paths measured: False/None none, True or "no-ray" as before, "ray",
    or "all" (both, beside the engine in process)."""
    if not http:
        return ()
    if http is True:
        return ("no-ray",)
    if http == HTTP_ALL:
        return HTTP_MODES
    if http not in HTTP_MODES:
        raise ValueError(f"http: {http!r} is not one of {HTTP_MODES + (HTTP_ALL,)}")
    return (http,)


def run_bench_serve(folder, clients=(1, 4, 16, 64), n_requests: int = 64, max_tokens: int = 32,
                    provider: str = "auto", threads: int | None = 1, http: bool = False, rounds: int = 1,
                    max_rows: int | None = None, log=None, **engine_options) -> dict:
    """`threads`: ONNX Runtime's intra-op threads, 1 as `serve` and `bench-serve` default to (None:
    ORT's own default, a spinning pool over every core, which fights the engine's threads and the
    clients for the CPU: bundled Mamba at 2 cores served 1.9-2.0x one at a time with it, 3.3x with 1).

    `rounds`: the whole set measured that many times one after another (one at a time, then each
    client count's continuous and static runs); each figure is the median over the rounds, and a
    ratio the median of each round's own ratio (its modes measured minutes apart at most, not the
    whole run apart: on a noisy machine identical runs wandered by a quarter).

    `max_rows`: the running batch's rows at most (None: as many as clients); fewer rows than
    clients trade time to first token and tokens/s for per-token latency."""
    log = log or (lambda msg: None)
    model = load(folder, provider=provider, threads=threads)
    prompts = bench_prompts(model, n_requests)
    counts = np.random.default_rng(1).integers(max(1, max_tokens // 4), max_tokens + 1, n_requests)
    work = [(p, int(n)) for p, n in zip(prompts, counts)]
    generate(model, prompts[:2], _options(max_tokens))  # warm up ORT's kernels
    engine_options.pop("max_queue", None)  # closed-loop clients: never more than `clients` wait
    modes = _http_modes(http)

    def rows_for(c: int) -> int:
        return c if max_rows is None else min(c, max_rows)

    result = {"folder": str(folder), "family": model.family, "provider": model.provider, "threads": threads,
              "requests": n_requests, "max_tokens": max_tokens, "http": http, "max_rows": max_rows, "rows": {}}
    log(f"{model.family} from {folder} on {model.provider}: {n_requests} requests of "
        f"{max(1, max_tokens // 4)}-{max_tokens} tokens" + (f", {rounds} rounds" if rounds > 1 else ""))
    servers: dict = {}
    measured = []
    try:
        for mode in modes:
            servers[mode] = _http_server(folder, mode, rows_for(max(clients)), n_requests, provider, threads,
                                         engine_options, work)
        for r in range(rounds):
            one = batched(model, work, 1)
            alone = _one_http_client(servers, work, clients, side_by_side=_side_by_side(http))
            rows = {}
            for c in clients:
                rows[c] = _continuous_ways(model, work, c, rows_for(c), n_requests, servers,
                                           side_by_side=_side_by_side(http), **engine_options)
                rows[c]["static"] = batched(model, work, rows_for(c))
                log(f"{f'round {r + 1}: ' if rounds > 1 else ''}{c} clients: " + _progress(rows[c], one))
            measured.append(_with_ratios(one, rows, alone))
    finally:
        for server in servers.values():
            server.stop()
    if rounds == 1:
        result |= measured[0]
    else:
        result |= _medians(measured, clients)
    for c in clients:  # the floor under each client count's per-token latency
        if c > 1:
            row = result["rows"][c]
            held = row["continuous"].get("rows_per_step")  # (over HTTP: unknown, as many as may run)
            row["step_floor"] = step_floor(model, prompts, round(held or rows_for(c)))
            if held is not None:
                with_ceiling(row)
    return result


def with_ceiling(row: dict) -> None:
    """The batch's own ceiling over one at a time, into `row` (a client count's figures with its
    `step_floor`): `rows_per_step` tokens a step, a step costing `step_vs_1_row` one-row steps (no
    encoder, no Python); and how much of it the engine reached."""
    floor = row["step_floor"]
    floor["ceiling"] = row["continuous"]["rows_per_step"] / floor["step_vs_1_row"]
    row["speedup_vs_ceiling"] = row["speedup_vs_one_at_a_time"] / floor["ceiling"]


def _side_by_side(http) -> bool:
    """Whether the engine in process runs beside the HTTP paths (`all`, and `ray`: the issue's
    figure is Ray Serve's 16÷1 over the engine's); plain `--http` keeps the server as "continuous"."""
    return http in (HTTP_ALL, "ray")


def _one_http_client(servers: dict, work, clients, side_by_side: bool) -> dict:
    """One HTTP client through each server, by its HTTP key: each path's own "one at a time"
    (taken from the 1-client run instead when 1 is among the client counts)."""
    if not side_by_side or 1 in clients:
        return {}
    return {_http_key(mode): over_http(server.url, work, 1) for mode, server in servers.items()}


def _continuous_ways(model, work, clients: int, rows: int, n_requests: int, servers: dict, side_by_side: bool,
                     **engine_options) -> dict:
    """Continuous batching at `clients` clients, each way asked for, one after another: "continuous" the
    engine in this process (or, alone over HTTP, the server); side by side, also "http_no_ray" and
    "http_ray", the same work from clients of a `serve --no-ray` and of a Ray Serve `serve`."""
    out = {}
    if side_by_side or not servers:
        engine = Engine(model, max_rows=rows, max_queue=max(n_requests, 1), **engine_options).start()
        try:
            out["continuous"] = continuous(engine, work, clients)
        finally:
            engine.close()
    for mode, server in servers.items():
        out[_http_key(mode) if side_by_side else "continuous"] = over_http(server.url, work, clients)
    return out


def _http_key(mode: str) -> str:
    return "http_" + mode.replace("-", "_")  # http_no_ray, http_ray


HTTP_KEYS = tuple(_http_key(m) for m in HTTP_MODES)
HTTP_NAMES = {"continuous": "in process", "http_no_ray": "HTTP, no Ray", "http_ray": "HTTP, Ray Serve"}


def _progress(row: dict, one: dict) -> str:
    ways = [k for k in ("continuous", *HTTP_KEYS) if k in row]
    names = HTTP_NAMES if len(ways) > 1 else {"continuous": "continuous"}
    return ", ".join(f"{names[k]} {row[k]['tokens_per_s']:.0f} tok/s" for k in ways) + \
        f", static {row['static']['tokens_per_s']:.0f} tok/s, one at a time {one['tokens_per_s']:.0f} tok/s"


PATHS = ("continuous", *HTTP_KEYS)  # the ways a request is served concurrently
RATIOS = ("speedup_vs_one_at_a_time", "static_vs_one_at_a_time", "token_p50_vs_one_client",
          *(f"{k}_{what}" for k in HTTP_KEYS
            for what in ("vs_one_at_a_time", "vs_in_process", "token_p50_vs_one_client", "scaling_vs_in_process")),
          *(f"{k}_vs_one_client" for k in PATHS))


def _medians(measured: list[dict], clients) -> dict:
    """Every round's figures as medians (each ratio the median of the rounds' own)."""
    result: dict = {"rows": {}}
    result["one_at_a_time"] = _median_figures([m["one_at_a_time"] for m in measured])
    if "one_http_client" in measured[0]:
        result["one_http_client"] = {k: _median_figures([m["one_http_client"][k] for m in measured])
                                     for k in measured[0]["one_http_client"]}
    for c in clients:
        runs = [m["rows"][c] for m in measured]
        row = {mode: _median_figures([x[mode] for x in runs])
               for mode in ("continuous", "static", *HTTP_KEYS) if mode in runs[0]}
        for key in RATIOS:
            values = [x[key] for x in runs if key in x]
            if values:
                row[key] = float(np.median(values))
                row[key + "_rounds"] = values
        result["rows"][c] = row
    result["rounds"] = measured
    return result


def _with_ratios(one: dict, rows: dict, alone: dict | None = None) -> dict:
    """One round's figures with its ratios: each client count's tokens/s over generate()'s one at
    a time in process; each path's tokens/s and per-token p50 over the same path's at 1 client
    (when 1 client was measured, or `alone` has the HTTP path's single client: `PATH_vs_one_client`;
    the in-process p50 ratio keeps its name, `token_p50_vs_one_client`); side by side, each HTTP
    way's tokens/s over the engine's in process, and its N÷1 over the engine's N÷1
    (`PATH_scaling_vs_in_process`: the HTTP path's N clients over its 1 client, over the engine's
    N clients over generate() one at a time)."""
    single = {**(alone or {}), **rows.get(1, {})}
    for row in rows.values():
        row["speedup_vs_one_at_a_time"] = row["continuous"]["tokens_per_s"] / one["tokens_per_s"]
        row["static_vs_one_at_a_time"] = row["static"]["tokens_per_s"] / one["tokens_per_s"]
        for key in (k for k in PATHS if k in row and k in single):
            row[f"{key}_vs_one_client"] = row[key]["tokens_per_s"] / single[key]["tokens_per_s"]
            p50 = "token_p50_vs_one_client" if key == "continuous" else f"{key}_token_p50_vs_one_client"
            base = single[key]["token_p50_ms"]  # 0 where one client's tokens came in one read
            row[p50] = row[key]["token_p50_ms"] / base if base else float("nan")
        for key in HTTP_KEYS:
            if key in row:
                row[f"{key}_vs_one_at_a_time"] = row[key]["tokens_per_s"] / one["tokens_per_s"]
                row[f"{key}_vs_in_process"] = row[f"{key}_vs_one_at_a_time"] / row["speedup_vs_one_at_a_time"]
                if f"{key}_vs_one_client" in row:
                    row[f"{key}_scaling_vs_in_process"] = \
                        row[f"{key}_vs_one_client"] / row["speedup_vs_one_at_a_time"]
    return {"one_at_a_time": one, "rows": rows} | ({"one_http_client": alone} if alone else {})


def _median_figures(figures: list[dict]) -> dict:
    """Each figure's median over rounds (tokens: the same work every round)."""
    return {key: float(np.median([f[key] for f in figures])) for key in figures[0]}


def _via(http) -> str:
    if http == HTTP_ALL:
        return "continuous in the engine, over HTTP (SSE) from `serve --no-ray` and through Ray Serve (`serve`)"
    if http == "ray":
        return "continuous in the engine, and over HTTP (SSE) through Ray Serve (`serve`)"
    return "continuous over HTTP (SSE)" if http else "continuous in the engine"


MODE_LABELS = {"continuous": "continuous", "static": "static", "http_no_ray": "http-noray", "http_ray": "http-ray"}


def _ratio(x: float | None, width: int) -> str:
    return f"{x:>{width - 1}.2f}x" if x is not None else f"{'-':>{width}}"


def _row_line(c: int, row: dict, mode: str) -> str:
    """One table line. Two tokens/s ratios, each over its own base: generate() one at a time in
    process (every mode), and the same path with one client (an HTTP path's own single client)."""
    f = row[mode]
    generate_ratio = row["static_vs_one_at_a_time" if mode == "static" else
                         "speedup_vs_one_at_a_time" if mode == "continuous" else f"{mode}_vs_one_at_a_time"]
    p50 = row.get("token_p50_vs_one_client" if mode == "continuous" else f"{mode}_token_p50_vs_one_client")
    return (f"{c:>7} | {MODE_LABELS[mode]:<10} | {f['tokens_per_s']:>7.0f} | {f['ttft_p50_ms']:>7.1f}ms | "
            f"{f['ttft_p99_ms']:>7.1f}ms | {f['token_p50_ms']:>5.2f}ms | {f['token_p99_ms']:>5.2f}ms | "
            f"{_ratio(generate_ratio, 18)} | {_ratio(row.get(f'{mode}_vs_one_client'), 17)} | {_ratio(p50, 8)}")


def _http_lines(result: dict) -> list[str]:
    """Side by side: each client count's tokens/s over one at a time's, each way, and HTTP over in process."""
    lines = []
    for c, row in result["rows"].items():
        ways = [k for k in HTTP_KEYS if k in row]
        if ways:
            lines.append(f"{c:>7} clients / generate() one at a time: in process {row['speedup_vs_one_at_a_time']:.2f}x | " +
                         " | ".join(f"{HTTP_NAMES[k]} {row[k + '_vs_one_at_a_time']:.2f}x "
                                    f"(HTTP / in process {row[k + '_vs_in_process']:.2f}x)" for k in ways))
    return lines


def _scaling_lines(result: dict) -> list[str]:
    """Each HTTP path's N clients ÷ its 1 client, over the engine's N clients ÷ generate() one at a
    time (with rounds: the median of the rounds' own ratios, then every round's)."""
    lines = []
    for c, row in result["rows"].items():
        for key in (k for k in HTTP_KEYS if f"{k}_scaling_vs_in_process" in row):
            each = _each(row, f"{key}_scaling_vs_in_process")
            lines.append(f"{HTTP_NAMES[key]}: HTTP {c}÷1 ÷ in-process {c}÷1 "
                         f"{row[f'{key}_scaling_vs_in_process']:.2f}x (HTTP {row[f'{key}_vs_one_client']:.2f}x, "
                         f"in process {row['speedup_vs_one_at_a_time']:.2f}x)" + (f"; rounds {each}" if each else ""))
    return lines


def _each(row: dict, key: str) -> str:
    return " ".join(f"{x:.2f}x" for x in row.get(key + "_rounds", []))


def _rounds_lines(result: dict) -> list[str]:
    lines = [f"medians of {len(result['rounds'])} rounds; each round's own ratios:"]
    for c, row in result["rows"].items():
        p50 = _each(row, "token_p50_vs_one_client")
        lines.append(f"{c:>7} clients: vs generate() 1-at-a-time {_each(row, 'speedup_vs_one_at_a_time')}" +
                     (f" | tok p50 vs 1 client {p50}" if p50 else ""))
        for key in HTTP_KEYS:
            if key + "_vs_in_process_rounds" in row:
                own = _each(row, key + "_vs_one_client")
                lines.append(f"{'':>7}   {HTTP_NAMES[key]}: vs generate() 1-at-a-time {_each(row, key + '_vs_one_at_a_time')}"
                             + (f" | vs 1 HTTP client {own}" if own else "")
                             + f" | HTTP / in process {_each(row, key + '_vs_in_process')}")
    return lines


def format_table(result: dict) -> str:
    one = result["one_at_a_time"]
    lines = [f"{result['family']} {result['folder']} ({result['provider']}, threads {result['threads']}): "
             f"{result['requests']} requests of {max(1, result['max_tokens'] // 4)}-{result['max_tokens']} "
             f"tokens; {_via(result.get('http'))}" +
             (f"; the batch at most {result['max_rows']} rows" if result.get("max_rows") else ""),
             f"one at a time (generate): {one['tokens_per_s']:.0f} tok/s, first token p50 {one['ttft_p50_ms']:.1f} ms, "
             f"per token p50 {one['token_p50_ms']:.2f} ms",
             f"{'clients':>7} | {'mode':<10} | {'tok/s':>7} | {'ttft p50':>9} | {'ttft p99':>9} | {'tok p50':>7} | "
             f"{'tok p99':>7} | vs generate() 1by1 | vs 1 client, same | tok p50 vs 1 client, same path"]
    for c, row in result["rows"].items():
        lines += [_row_line(c, row, mode) for mode in ("continuous", *HTTP_KEYS, "static") if mode in row]
    floors = [(c, row["step_floor"]) for c, row in result["rows"].items() if "step_floor" in row]
    if floors:
        lines.append("the batched step alone, as the engine runs it (what per-token latency cannot go below):")
        for c, f in floors:
            rows = result["rows"][c]["continuous"].get("rows_per_step")
            lines.append(f"{c:>7} clients: {f['rows']} rows{f' (the batch held {rows:.1f} a step)' if rows else ''} "
                         f"{f['step_ms']:.3f} ms vs 1 row {f['step_ms_1_row']:.3f} ms: {f['step_vs_1_row']:.2f}x")
            if "ceiling" in f:
                lines.append(f"{'':>7}   ceiling over one at a time (rows a step / that): {f['ceiling']:.2f}x; "
                             f"continuous reached {result['rows'][c]['speedup_vs_ceiling']:.2f} of it")
    lines += _http_lines(result)
    for key, f in result.get("one_http_client", {}).items():
        lines.append(f"one HTTP client ({HTTP_NAMES[key]}): {f['tokens_per_s']:.0f} tok/s, first token p50 "
                     f"{f['ttft_p50_ms']:.1f} ms, per token p50 {f['token_p50_ms']:.2f} ms")
    lines += _scaling_lines(result)
    if "rounds" in result:
        lines += _rounds_lines(result)
    return "\n".join(lines)
