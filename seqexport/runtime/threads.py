"""How many intra-op threads a runner (ONNX Runtime, OpenVINO) uses."""

import os

from seqexport.errors import UsageError


def thread_count(threads: int | None) -> int:
    """The intra-op threads a runner uses: `threads`, else $SEQEXPORT_THREADS, else 0 (the
    runtime's own default). UsageError naming a value that is not a whole number >= 0 (passed
    on, ONNX Runtime's error read "cannot load <graph>", as if the file were at fault)."""
    if isinstance(threads, bool) or not isinstance(threads, int | None) or (threads or 0) < 0:
        raise UsageError(f"threads: expected an integer >= 0 or None (the runtime's default), got {threads!r}")
    if threads:
        return threads
    env = os.environ.get("SEQEXPORT_THREADS", "").strip()
    if env and not env.isdigit():
        raise UsageError(f"SEQEXPORT_THREADS={env!r}: expected a whole number >= 0 (0: the runtime's default)")
    return int(env or 0)
