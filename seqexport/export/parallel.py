"""A model's graphs traced side by side, one process per core.

torch.onnx traces one graph on one core (torch.export is Python), and a model's graphs are
independent of one another: the transformer's encoder and decoder, a recurrent model's
prefill and step. So the first graphs go to forked children (the model and torch already in
memory: no second import, weights shared copy-on-write) while this process traces the last;
each child hands its ModelProto back through a file in the export's temporary folder, its
weights as references to the parameters both processes hold (`weights.as_references`). The
graphs that come out are the ones a sequential export makes: each is traced by the same call.

Sequential instead: one core, no `os.fork` (not POSIX), a model whose graph would not fit
one protobuf (over 2 GB: saved with its weights outside), SEQEXPORT_EXPORT_JOBS=1, or other
Python threads running (a lock one of them holds at the fork would never be released in
the child: e.g. `seqexport export` called from a server or a test runner's worker).
A fork copies every object but none of the threads behind them; an inherited ONNX Runtime
session whose destructor ran in the child would wait forever for its thread pool (seen: a
test worker's earlier session, collected by the child's garbage collector). So the parent's
objects are frozen out of the collector across the fork (the child collects only its own
garbage, never what it inherited), and the child ends with os._exit (no finalisers).
"""

import gc
import os
import pickle
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch

from seqexport.errors import ExportError, SeqexportError, UsageError
from seqexport.export import common, weights
from seqexport.specs import GraphSpec


@dataclass
class GraphJob:
    """One `common.export_graph` call, with what `step` announces it as."""

    label: str
    module: torch.nn.Module
    args: tuple
    spec: GraphSpec
    path: Path
    opset: int
    dynamic_shapes: object
    custom_translation_table: dict | None = None

    def run(self) -> onnx.ModelProto:
        return common.export_graph(self.module, self.args, self.spec, self.path, self.opset, self.dynamic_shapes,
                                   self.custom_translation_table)


def export_jobs() -> int:
    """How many graphs may be traced at once: SEQEXPORT_EXPORT_JOBS, else the cores we may use."""
    value = os.environ.get("SEQEXPORT_EXPORT_JOBS")
    if value is not None:
        if not value.isdigit() or int(value) < 1:
            raise UsageError(f"SEQEXPORT_EXPORT_JOBS={value!r}: expected a whole number >= 1")
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def export_graphs(jobs: list[GraphJob]) -> None:
    """Run every job (inside `write_artifact`: its graphs join the pending ones, in order)."""
    workers = min(len(jobs), export_jobs())
    if workers < 2 or not hasattr(os, "fork") or common._pending is None or threading.active_count() > 1 or \
            not all(common.fits_one_protobuf(j.module) for j in jobs):
        for job in jobs:
            with common.step(f"exporting {job.label}"):
                job.run()
        return
    forked, here = jobs[: workers - 1], jobs[workers - 1 :]
    names = " and ".join(j.label for j in jobs)
    with common.step(f"exporting {names} ({workers} processes)"):
        running: dict[int, tuple[GraphJob, Path]] = {}
        done = []
        first = len(common._pending)  # where the sequential order puts the children's graphs
        try:
            for job in forked:
                pid, out = _fork(job)
                running[pid] = (job, out)
            for job in here:
                job.run()
            for pid, (job, out) in list(running.items()):
                status = _wait(pid)
                del running[pid]
                done.append((job, _collect(job, status, out)))
        except BaseException:  # this graph failed, a child did, or Ctrl-C: no child outlives the export
            for pid in running:
                _stop(pid)
            raise
    common._pending[first:first] = [
        common.PendingGraph(job.spec.name, Path(job.path), model, job.module, arrays, {})
        for job, (model, arrays) in done]


_STOPS = {signal.SIGINT, signal.SIGTERM}


def _fork(job: GraphJob) -> tuple[int, Path]:
    out = Path(job.path).with_suffix(".proto")
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # every object so far out of the collector's reach, here and in the child
    # A Ctrl-C or SIGTERM that lands during the fork could otherwise be handled in the child
    # only (seen: the child's at-fork hooks ran the handler, the parent exported on); blocked
    # across it, it reaches the parent once unblocked.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    pid = -1  # stays so when the fork fails: this process goes on as the parent
    try:
        pid = os.fork()
    finally:
        if pid:
            gc.unfreeze()
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's _stop ends the child at once
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    if pid:
        return pid, out
    code = 1
    try:  # the child: export, hand the graph (or the error) back, never return into the caller
        torch.set_num_threads(1)  # one core each; the parent traces on the other
        common._pending = []
        job.run()
        graph = common._pending[-1]
        # the graph without its large weights, and those as references to the parameters the
        # parent holds too (a weight torch computed, e.g. a folded constant, as its values)
        out.write_bytes(graph.model.SerializeToString())
        out.with_suffix(".arrays").write_bytes(pickle.dumps(weights.as_references(graph.arrays, graph.sources),
                                                            protocol=5))
        code = 0
    except KeyboardInterrupt:
        code = 130
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        error = e if isinstance(e, SeqexportError) else ExportError(f"exporting {job.label}: {type(e).__name__}: {e}")
        try:
            out.with_suffix(".error").write_bytes(pickle.dumps(error))
        except Exception:  # an error that does not pickle: its message
            out.with_suffix(".error").write_bytes(pickle.dumps(ExportError(f"exporting {job.label}: {e}")))
    finally:
        os._exit(code)


def _wait(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _collect(job: GraphJob, code: int, out: Path) -> tuple[onnx.ModelProto, dict]:
    """The child's graph and its initializers' arrays, or its error raised here."""
    error = out.with_suffix(".error")
    if code == 130 or code == -signal.SIGINT:
        raise KeyboardInterrupt
    if error.exists():
        raise pickle.loads(error.read_bytes())
    if code != 0 or not out.exists():
        raise ExportError(f"exporting {job.label}: the exporting process ended with status {code}")
    model = onnx.ModelProto()
    model.ParseFromString(out.read_bytes())
    references = pickle.loads(out.with_suffix(".arrays").read_bytes())
    out.unlink()
    out.with_suffix(".arrays").unlink()
    return model, weights.resolved(references, common.numpy_params(job.module))


def _stop(pid: int) -> None:
    """End a child still running (not yet waited for, so its pid is still its own)."""
    try:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
