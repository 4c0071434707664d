"""`seqexport serve` and `seqexport bench-serve`: the engine over HTTP, and its benchmark."""

import json
from pathlib import Path

import click

from seqexport.cli.group import check_output_path, cli
from seqexport.errors import UsageError
from seqexport.serve.clients import DEFAULT_GRACE_S, DEFAULT_TIMEOUT_S


def engine_options(f):
    """The engine and server options `serve` and `bench-serve` share."""
    for opt in reversed([
        click.option("--max-rows", type=click.IntRange(min=1), default=16, show_default=True,
                     help="Rows of the running batch (requests decoding together)."),
        click.option("--max-queue", type=click.IntRange(min=1), default=256, show_default=True,
                     help="Waiting requests beyond which the server answers 503."),
        click.option("--max-prompt-tokens", type=click.IntRange(min=1), default=2048, show_default=True,
                     help="Longer prompts are refused (400)."),
        click.option("--max-state-mb", type=click.FloatRange(min=0, min_open=True),
                     help="Cap on the running batch's cache/state memory, MiB [none]."),
        click.option("--prefill-chunk", type=click.IntRange(min=0), default=64, show_default=True,
                     help="N > 0: newcomers are begun on a starter thread beside the batched step (a "
                          "transformer's encoder, a Mamba's or RWKV-7's prefill), and where the engine thread "
                          "begins one itself it feeds up to N prompt tokens through the batched steps, one a round, "
                          "longer prompts' earlier tokens prefilled N a round. 0: no starter; each request is "
                          "prefilled as it joins (stalls the batch)."),
        click.option("--start-batch", type=click.IntRange(min=1), default=4, show_default=True,
                     help="Waiting requests the starter thread prefills in one run, for a model whose prefill takes "
                          "prompts of unequal length (Mamba and RWKV-7 exports with an attention mask)."),
        click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
                     help="ONNX Runtime intra-op threads per engine (the engine thread and the HTTP server need "
                          "CPU too; more replicas use more cores)."),
        click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                     help="ONNX Runtime execution provider."),
        click.option("--pin-threads", is_flag=True,
                     help="Keep the engine thread on the first CPU this process may use and the starter thread on "
                          "the others (Linux; one engine a machine: not with several replicas)."),
    ]):
        f = opt(f)
    return f


def _engine_kwargs(kw: dict) -> dict:
    from seqexport.runtime.engine.pinning import cannot_pin

    if kw.get("pin_threads") and (why := cannot_pin()):
        raise UsageError(f"--pin-threads: {why}")
    mb = kw.pop("max_state_mb")
    return {**kw, "max_state_bytes": None if mb is None else int(mb * 2**20)}


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.option("--ray/--no-ray", "use_ray", default=True,
              help="A Ray Serve deployment (default) or one plain uvicorn process.")
@click.option("--address", help="Join this Ray cluster (e.g. auto, or ray://HEAD:10001) [a local Ray].")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Replicas, each with its own engine.")
@click.option("--autoscale", metavar="MIN:MAX", help="Autoscale between MIN and MAX replicas (instead of --replicas).")
@click.option("--replica-cpus", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Ray CPUs reserved per replica.")
@click.option("--model-name", help="The model id clients name [the folder's name].")
@click.option("--timeout", "request_timeout", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds a request may take before it ends with 504.")
@click.option("--allow-origin", "allow_origins", multiple=True, metavar="ORIGIN",
              help="A web page's origin (scheme://host[:port], or * for any) whose scripts may call this "
                   "server (CORS; repeat for several) [same-origin only].")
@click.option("--client-timeout", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_TIMEOUT_S,
              show_default=True,
              help="Seconds a client may take to send a whole request (408 after), or to take none of its "
                   "answer (cut after); an idle connection closes after it too.")
@click.option("--max-connections", type=click.IntRange(min=1),
              help="Client connections held at once; past it a new one closes the one idle longest, or gets "
                   "503 if every one has a request being answered [what the open-file limit leaves].")
@click.option("--shutdown-grace", type=click.FloatRange(min=0), default=DEFAULT_GRACE_S, show_default=True,
              help="On SIGTERM or Ctrl-C, seconds the requests in progress may take to finish; then each ends "
                   "with 503 'shutting down; retry' (a stream: an error event, then [DONE]).")
@click.option("--config-out", type=click.Path(dir_okay=False),
              help="Write a Ray Serve config file (for `serve deploy` on a cluster) and exit.")
@click.option("--generation-config", type=click.Choice(["model", "none"]), default="model", show_default=True,
              help="model: a request that leaves out temperature, top_p, top_k or max_tokens takes the model's "
                   "default (its checkpoint's generation_config.json, as vLLM does); none: OpenAI's defaults.")
@engine_options
def serve(folder, **kw):
    """Serve an exported FOLDER over HTTP: OpenAI-style /v1/completions with continuous batching.

    Also GET /v1/models, /health and /metrics (Prometheus). Needs the `serve` extra.
    """
    check_output_path(kw["config_out"], "--config-out")
    kw["allow_origins"] = checked_origins(kw["allow_origins"])
    given = click.get_current_context().get_parameter_source
    limits = [f"--{n.replace('_', '-')}" for n in ("client_timeout", "max_connections", "shutdown_grace")
              if given(n) is not click.core.ParameterSource.DEFAULT]
    if limits and (kw["address"] or kw["autoscale"] or kw["config_out"]):
        raise UsageError(f"{' and '.join(limits)}: held by `serve`'s own front (the embedded default, or --no-ray); "
                         "with --address, --autoscale or --config-out Ray Serve's HTTP proxy takes the requests")
    serve_command(folder, log=lambda msg: click.echo(msg, err=True), **_engine_kwargs(kw))


@cli.command("bench-serve")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--clients", "clients", type=click.IntRange(min=1), multiple=True,
              help="Concurrent clients (repeat) [1 4 16 64].")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests per figure.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Most tokens a request asks for (each asks for a quarter of it to all of it; eos ignored).")
@click.option("--http", type=click.Choice(["no-ray", "ray", "all"]), is_flag=False, flag_value="no-ray",
              help="Continuous batching over HTTP (SSE clients) instead of in the engine: no-ray (plain `--http`) "
                   "through a `serve --no-ray` subprocess, ray through `serve`'s default Ray Serve deployment; "
                   "all: in the engine, no-ray and ray side by side, with HTTP / in process.")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Measure everything this many times in turn; report medians and each round's ratios.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write every figure as JSON here.")
@engine_options
def bench_serve(folder, clients, n_requests, max_tokens, http, rounds, json_path, **kw):
    """Time the engine on an exported FOLDER: continuous batching vs one at a time vs static batches.

    Tokens/s, time to first token and per-token latency (p50/p99) at each client count. The
    batch holds a row per client unless --max-rows caps it (the per-token latency it buys is
    paid in time to first token and tokens/s); --max-queue is `serve`'s alone.
    """
    from seqexport.bench.serve import format_table, run_bench_serve

    check_output_path(json_path, "--json")
    given = click.get_current_context().get_parameter_source
    if given("max_queue") is not click.core.ParameterSource.DEFAULT:
        raise UsageError(f"--max-queue {kw['max_queue']}: bench-serve's closed-loop clients never have more than "
                         "--clients requests waiting; the queue cap is `serve`'s")
    max_rows = kw.pop("max_rows")  # a cap when given; by default each client count runs a row per client
    if given("max_rows") is click.core.ParameterSource.DEFAULT:
        max_rows = None
    result = run_bench_serve(folder, clients=clients or (1, 4, 16, 64), n_requests=n_requests,
                             max_tokens=max_tokens, http=http, rounds=rounds, max_rows=max_rows,
                             log=lambda msg: click.echo(msg, err=True), **_engine_kwargs(kw))
    click.echo(format_table(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)


def checked_origins(origins: tuple[str, ...]) -> list[str] | None:
    """--allow-origin values as CORS compares them: a browser's Origin header is scheme://host
    and a port, nothing after it, so "http://localhost:3000/" would never match: refused."""
    import re

    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s?#]+", origin):
            raise UsageError(f"--allow-origin {origin!r}: expected an origin, scheme://host[:port] with no path "
                             "(e.g. http://localhost:3000), or * for any")
    return list(origins) or None


def parse_autoscale(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        low, high = (int(x) for x in text.split(":"))
    except ValueError:
        raise UsageError(f"--autoscale {text!r}: expected MIN:MAX replicas, e.g. 1:4") from None
    return low, high


def serve_command(folder: str, *, host: str, port: int, use_ray: bool, address: str | None, replicas: int,
                  autoscale: str | None, replica_cpus: float, config_out: str | None, log,
                  client_timeout: float = DEFAULT_TIMEOUT_S, max_connections: int | None = None,
                  shutdown_grace: float = DEFAULT_GRACE_S, **engine) -> None:
    folder = str(Path(folder).resolve())  # replicas may start in another working directory
    from seqexport.manifest import read_manifest
    from seqexport.serve.app import ServeConfig
    from seqexport.serve.clients import ClientLimits, make_room_for
    from seqexport.serve.run import run_plain, run_ray

    manifest = read_manifest(folder)  # a missing or altered export fails here, in one line
    _say_defaults(manifest.get("generation"), engine.get("generation_config", "model"), log)
    if engine.get("pin_threads") and (replicas != 1 or autoscale):
        raise UsageError("--pin-threads puts every engine's thread on the same first CPU: use it with one replica "
                         "(no --replicas N > 1 or --autoscale)")
    config = ServeConfig(folder, **engine)
    scaling = {"replicas": replicas, "autoscale": parse_autoscale(autoscale), "replica_cpus": replica_cpus}
    if config_out:
        write_config(config_out, config, host, port, scaling)
        log(f"wrote {config_out}: deploy it with `serve deploy {config_out}` on a Ray cluster")
        return
    if max_connections:  # before the model loads: a limit too low for it fails at once
        make_room_for(max_connections)
    limits = ClientLimits(client_timeout, max_connections, shutdown_grace)
    if use_ray:
        run_ray(config, host, port, address, scaling, log, limits)
    else:
        if address or replicas != 1 or autoscale:
            raise UsageError("--address, --replicas and --autoscale need Ray; drop --no-ray")
        run_plain(config, host, port, log, manifest, limits)


def _say_defaults(record: dict | None, source: str, log) -> None:
    """Which generation defaults a request will take, and which of the model's cannot apply."""
    from seqexport.generation_config import not_applied_note
    from seqexport.serve.app import served_defaults

    if not record:
        return
    taken = served_defaults(record["defaults"], source)
    if taken:
        log(f"requests that leave them out take the model's generation defaults ({record['file']}): "
            + ", ".join(f"{k} {v}" for k, v in taken.items()) + " (--generation-config none: OpenAI's)")
    if source == "model" and (note := not_applied_note(record)):
        log(f"warning: {note}")


def write_config(path: str, config, host: str, port: int, scaling: dict) -> None:
    from seqexport.serve.ray_app import config_file

    data = config_file(config, host, port, **scaling)
    try:
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    except ImportError:  # JSON is YAML too
        text = json.dumps(data, indent=2)
    Path(path).write_text(text)
