"""The `seqexport` entry point: exit codes for Ctrl-C, SIGTERM, usage errors and a closed pipe."""

import os
import signal
import sys
import threading

import click

from seqexport.cli.group import PipeClosed, cli

INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader went away (e.g. `| head`), as Unix tools end


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
    except (BrokenPipeError, PipeClosed):
        # the reader is gone: nothing more to say to it, and nothing for Python to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = BROKEN_PIPE
    sys.exit(code if isinstance(code, int) else 0)
