"""The `seqexport` group: every command's errors a user can cause become one line + exit 2."""

import os
from pathlib import Path

import click

from seqexport.errors import SeqexportError, UsageError
from seqexport.export.atomic import file_in_the_way


class PipeClosed(Exception):
    """The reader of stdout went away (e.g. `| head`). Not an OSError: click's `main` would turn
    that into a silent exit 1; `cli.main` ends with 141, as Unix tools do."""


class _Group(click.Group):
    """Turns our typed errors into one line + exit 2 for every subcommand."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise PipeClosed() from None
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
        blocker = file_in_the_way(Path(folder))
        raise UsageError(f"{option} {path}: " + (f"{blocker} is a file, not a folder" if blocker is not None
                                                 else f"the folder {folder} does not exist"))
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
