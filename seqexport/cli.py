"""`seqexport` command line: export, validate, generate, bench, inspect, quantize, serve, bench-serve, demo.

Each command is a short function over the public Python API. Errors a user can
cause (seqexport.errors) print one line on stderr and exit 2; `--debug` shows
the traceback instead.
"""

import json
import os
import signal
import sys
import threading

import click

from seqexport.errors import SeqexportError, UsageError

INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader went away (e.g. `| head`), as Unix tools end


class _Group(click.Group):
    """Turns our typed errors into one line + exit 2 for every subcommand."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise
        except (SeqexportError, OSError) as e:  # OSError: a path the user named
            if ctx.params.get("debug") or (ctx.parent and ctx.parent.params.get("debug")):
                raise
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)


def check_output_path(path: str | None, option: str) -> None:
    """Refuse an output file that cannot be written, before any work is done."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a folder; expected a file path")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable")


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.version_option(package_name="seqexport")
def cli(debug):
    """Export PyTorch sequence models to ONNX, prove parity, decode without torch."""


@cli.group(cls=_Group)
def export():
    """Export a model to an ONNX artifact folder (graphs + manifest.json)."""


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--checkpoint", type=click.Path(), help="Eager checkpoint to compare with [the manifest's].")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--atol", type=click.FloatRange(min=0), help="Absolute tolerance [by dtype: 1e-4 for float32].")
@click.option("--rtol", type=click.FloatRange(min=0), help="Relative tolerance [by dtype: 1e-3 for float32].")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Decode steps.")
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True, help="Batch of the decodes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option("--min-top1", type=click.FloatRange(0, 1), help="int8 exports: teacher-forced top-1 agreement [0.95].")
@click.option("--min-tokens", type=click.FloatRange(0, 1),
              help="int8 exports: share of the free-running picks that are eager's argmax on the same prefix [0.75].")
def validate(folder, checkpoint, provider, atol, rtol, steps, batch, seed, report_path, min_top1, min_tokens):
    """Prove parity of an exported FOLDER with its eager model; exit 1 if any check fails.

    Checks every graph at several shapes, a teacher-forced decode against the eager
    full forward, and a free-running greedy decode; names the first diverging module.
    """
    from seqexport.parity.validate import validate as run_validate

    check_output_path(report_path, "--report")
    report = run_validate(folder, checkpoint=checkpoint, provider=provider, atol=atol, rtol=rtol,
                          steps=steps, batch=batch, seed=seed, log=lambda msg: click.echo(msg, err=True),
                          min_top1=min_top1, min_tokens=min_tokens)
    click.echo(report.table())
    if report_path:
        with open(report_path, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    sys.exit(0 if report.passed else 1)


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--text", multiple=True, help="Prompt text (repeat for a batch); needs a tokenizer in the manifest.")
@click.option("--ids", multiple=True, help='Prompt token ids, e.g. "1 2 3" (repeat for a batch).')
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Stop after this many new tokens.")
@click.option("--greedy/--sample", default=True, help="Greedy decoding (default) or sampling.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True),
              help="Sampling temperature [1.0].")
@click.option("--top-k", type=click.IntRange(min=0), help="Sampling: top-k (0: off) [0].")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), help="Sampling: nucleus probability [1.0].")
@click.option("--seed", type=click.IntRange(min=0), help="Sampling seed (reproducible output).")
@click.option("--beams", type=click.IntRange(min=1), default=1, show_default=True,
              help="Beam search width (every family; 1: greedy).")
@click.option("--eos-id", type=click.IntRange(min=0), help="Stop a row at this token [the tokenizer's eos].")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
def generate(folder, text, ids, max_new_tokens, greedy, temperature, top_k, top_p, seed, beams, eos_id, provider):
    """Generate from an exported FOLDER with the torch-free runtime, streaming the tokens."""
    from seqexport.runtime.cli_generate import run_generate

    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
    given = [f"--{k.replace('_', '-')}" for k, v in sampling.items() if v is not None]
    if greedy and given:
        click.echo(f"warning: {', '.join(given)} apply to sampling only; add --sample (decoding greedily)", err=True)
    defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": None}
    search = {k: defaults[k] if v is None else v for k, v in sampling.items()}
    run_generate(folder, text, ids, max_new_tokens=max_new_tokens, do_sample=not greedy, num_beams=beams,
                 eos_id=eos_id, provider=provider, log=lambda msg: click.echo(msg, err=True), **search)


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True, help="Batch size (repeat for several) [1].")
@click.option("--context", "contexts", type=click.IntRange(min=1), multiple=True,
              help="Transformer past length / Mamba prefill length (repeat) [16 64 256 1024; --fast: 4 16].")
@click.option("--new-tokens", type=click.IntRange(min=1), help="Tokens generated end to end [32; --fast: 4].")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Intra-op threads of torch and ORT alike.")
@click.option("--repeats", type=click.IntRange(min=1), help="Timed rounds per figure; medians reported [7; --fast: 2].")
@click.option("--fast", is_flag=True, help="Small sizes and few repeats (CI).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write every figure as JSON here.")
@click.option("--baseline", type=click.Path(file_okay=False),
              help="int8/int4 FOLDER: the float32 export to time it beside [its manifest's quantization source].")
def bench(folder, provider, batches, contexts, new_tokens, threads, repeats, fast, json_path, baseline):
    """Time eager PyTorch vs ONNX Runtime on an exported FOLDER: steps, prefill, generation, memory.

    An int8 or int4 FOLDER (`seqexport quantize`) is also timed beside its float32 source."""
    from seqexport.bench.int8 import baseline_of, format_int8_table, run_int8_bench
    from seqexport.bench.run import format_table, run_bench

    check_output_path(json_path, "--json")
    source = baseline_of(folder, baseline)
    result = run_bench(folder, provider=provider, batches=batches or (1,), contexts=contexts or None,
                       new_tokens=new_tokens, threads=threads, repeats=repeats, fast=fast,
                       log=lambda msg: click.echo(msg, err=True))
    click.echo(format_table(result))
    if source is not None:
        sizes = dict(contexts=(4, 16), new_tokens=4, repeats=2, sample_s=0.002) if fast else \
            dict(contexts=contexts or (16, 64), new_tokens=new_tokens or 16, repeats=repeats or 5)
        side = run_int8_bench(folder, source, threads=threads, **sizes, log=lambda msg: click.echo(msg, err=True))
        result[f"{side['weights']}_vs_float32"] = side  # int8_vs_float32 or int4_vs_float32
        click.echo(format_int8_table(side))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder of the quantised copy.")
@click.option("--bits", type=int, default=8, show_default=True,
              help="8: int8 weights and activations; 4: weight-only int4 (MatMulNBits, block-wise).")
@click.option("--mode", type=click.Choice(["dynamic", "static"]), default="dynamic", show_default=True,
              help="int8 only. dynamic: activations quantised on the fly (no calibration data); "
                   "static: activation ranges calibrated on the float32 model's own decodes (QDQ).")
@click.option("--calibration", type=click.Path(dir_okay=False, exists=True), default=None,
              help="static int8: a text file of prompts, one a line [seeded random token ids].")
@click.option("--per-channel", is_flag=True, help="int8: one scale per output channel of each weight.")
@click.option("--block-size", type=int, help="int4: weights per scale along the input dim (16-256, a power of 2) [32].")
@click.option("--accuracy-level", type=int,
              help="int4: MatMulNBits compute type of the activations, 4 int8, 1 float32 (0-4) [4].")
@click.option("--exclude", multiple=True, metavar="PATTERN",
              help="Keep float32 the weight MatMuls whose module path or node name matches (glob; repeat).")
@click.option("--include-head/--float-head", default=None,
              help="Quantise the output head at --bits too, or keep it float32 [int8: float32; int4: 8-bit].")
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder.")
def quantize(folder, out, bits, mode, calibration, per_channel, block_size, accuracy_level, exclude, include_head,
             overwrite):
    """Write an int8 or int4 copy of an exported FOLDER (ONNX Runtime's quantisation tools).

    Norms, softmax, embeddings, the scans and their state and the family's sensitive
    projections stay float32 (int8: the output head too; int4 makes it 8-bit). `seqexport
    validate` judges the copy by top-1 agreement with the float32 eager model and, for
    Mamba / RWKV-7, by the drift of every state tensor over 256 steps.
    """
    from seqexport.export.quantize import quantize as run_quantize

    texts = None
    if calibration:
        with open(calibration, encoding="utf-8") as f:
            texts = [line.rstrip("\n") for line in f if line.strip()]
    run_quantize(folder, out, bits=bits, mode=mode, per_channel=per_channel, block_size=block_size,
                 accuracy_level=accuracy_level, exclude=exclude, include_head=include_head, overwrite=overwrite,
                 calibration=texts, log=lambda msg: click.echo(msg, err=True))


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print manifest.json itself (for machines).")
def inspect(folder, as_json):
    """Describe an exported FOLDER: source, tokenizer, graphs with I/O names and dims, last parity."""
    from seqexport.manifest import describe, read_manifest

    m = read_manifest(folder, verify=False)
    click.echo(json.dumps(m, indent=2) if as_json else describe(folder, m))


@cli.command()
@click.option("--out", default="exported", show_default=True, type=click.Path(file_okay=False),
              help="Folder that receives the exported models.")
@click.option("-n", "n", type=click.IntRange(min=1), default=200, show_default=True,
              help="Held-out examples to decode.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Intra-op threads for torch and ONNX Runtime alike.")
def demo(out, n, threads):
    """Export the bundled models, validate them, decode their held-out split eager vs ORT.

    Exits 1 when a parity check fails.
    """
    from seqexport.demo import run_demo

    sys.exit(0 if run_demo(out, n, threads) else 1)


@cli.command()
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder of the site (written atomically).")
@click.option("--overwrite", is_flag=True, help="Replace an existing site at --out.")
@click.option("--max-prompt-tokens", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Longer prompts are refused by the page (a model's positional table may lower it).")
@click.option("--example", "examples", multiple=True, help="An example prompt the page offers (repeat).")
@click.option("--webgpu/--no-webgpu", default=True, show_default=True,
              help="Include onnxruntime-web's WebGPU build (27 MB) beside the WASM one (14 MB).")
@click.option("--node-modules", type=click.Path(file_okay=False, exists=True),
              help="A node_modules folder with onnxruntime-web and @huggingface/tokenizers [the locked versions, "
                   "installed with npm ci on first use].")
def web(folders, out, overwrite, max_prompt_tokens, examples, webgpu, node_modules):
    """Build a static site whose page decodes exported FOLDERS in the browser (onnxruntime-web).

    Serve it with any web server, e.g. `python -m http.server -d SITE`; the page fetches
    nothing from elsewhere.
    """
    from seqexport.web import build_site, summary

    result = build_site(folders, out, overwrite=overwrite, webgpu=webgpu, max_prompt_tokens=max_prompt_tokens,
                        examples=examples, node_modules=node_modules, log=lambda msg: click.echo(msg, err=True))
    click.echo(summary(result, out))


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
    ]):
        f = opt(f)
    return f


def _engine_kwargs(kw: dict) -> dict:
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
@click.option("--config-out", type=click.Path(dir_okay=False),
              help="Write a Ray Serve config file (for `serve deploy` on a cluster) and exit.")
@engine_options
def serve(folder, **kw):
    """Serve an exported FOLDER over HTTP: OpenAI-style /v1/completions with continuous batching.

    Also GET /v1/models, /health and /metrics (Prometheus). Needs the `serve` extra.
    """
    from seqexport.serve.run import serve_command

    check_output_path(kw["config_out"], "--config-out")
    serve_command(folder, log=lambda msg: click.echo(msg, err=True), **_engine_kwargs(kw))


@cli.command("bench-serve")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--clients", "clients", type=click.IntRange(min=1), multiple=True,
              help="Concurrent clients (repeat) [1 4 16 64].")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests per figure.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Most tokens a request asks for (each asks for a quarter of it to all of it; eos ignored).")
@click.option("--http", is_flag=True, help="Continuous batching through a `serve --no-ray` subprocess (SSE clients).")
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
    from seqexport.serve.bench import format_table, run_bench_serve

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


def _exit_interrupted(message: str) -> None:
    """Say so and exit 130 at once. Everything has unwound (temporary folders are gone), and
    interpreter shutdown after a Ctrl-C that landed inside an import could die of SIGINT (-2)."""
    click.echo(message, err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(INTERRUPTED)


def sigint_outside_imports(signum, frame) -> None:
    """Ctrl-C as KeyboardInterrupt, but never inside an import. Raised there it can unwind into a
    C++ extension's initialisation (torch's pybind11) that cannot pass it on, and the process
    aborts ("terminate called after throwing ... KeyboardInterrupt", SIGABRT). Inside one, the
    signal is sent again 50 ms later, until it lands outside every import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
            again.daemon = True  # exiting never waits for it
            again.start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def main():
    # SIGTERM unwinds like Ctrl-C, so an interrupted export removes its temporary folder.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
        signal.signal(signal.SIGINT, sigint_outside_imports)
    try:
        code = cli.main(prog_name="seqexport", standalone_mode=False)
    except click.exceptions.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
        _exit_interrupted("interrupted")
    except KeyboardInterrupt:
        _exit_interrupted("\ninterrupted")
    except click.ClickException as e:  # usage errors: one line, naming where help is
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        click.echo(f"error: {e.format_message()}{hint}", err=True)
        code = e.exit_code
    except BrokenPipeError:
        # the reader is gone: nothing more to say to it, and nothing for Python to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = BROKEN_PIPE
    sys.exit(code if isinstance(code, int) else 0)


def _register_subcommands():
    # Each command lives next to the code it drives; importing them is cheap
    # (torch is imported inside the commands that need it).
    from seqexport.export import commands as export_commands

    export_commands.register(export)


_register_subcommands()

if __name__ == "__main__":
    sys.exit(main())
