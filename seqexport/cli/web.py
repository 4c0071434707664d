"""`seqexport web`: a static site that decodes exported folders in the browser."""

import click

from seqexport.cli.group import cli


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
