"""`seqexport` command line: export, validate, generate, bench, inspect, quantize, serve, bench-serve, demo, web.

One module per command (`seqexport/cli/<command>.py`), each a short function over the
public Python API. Errors a user can cause (seqexport.errors) print one line on stderr and
exit 2; `--debug` shows the traceback instead (`group`). Importing the commands is cheap:
torch is imported inside the commands that need it.
"""

from seqexport.cli import bench, demo, export, generate, inspect, quantize, serve, validate, web  # noqa: F401 (registers)
from seqexport.cli.group import check_output_path, cli
from seqexport.cli.main import BROKEN_PIPE, INTERRUPTED, main, sigint_outside_imports

__all__ = ["BROKEN_PIPE", "INTERRUPTED", "check_output_path", "cli", "main", "sigint_outside_imports"]
