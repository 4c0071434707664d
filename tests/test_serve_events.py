"""The stream's token events from a template are the bytes `sse(chunk_body(...))` writes; the
replicas' registry holds a Unix socket's path or a port, and gives back which; the latency
histograms observe each token's gap to the one before it."""

import os
from types import SimpleNamespace

from seqexport.runtime.engine.request import Request
from seqexport.runtime.generate import SearchOptions
from seqexport.serve.front import Registry
from seqexport.serve.metrics import ServerMetrics
from seqexport.serve.protocol import ChunkEvents, chunk_body, sse


def test_token_events_are_the_chunks_sse_writes():
    events = ChunkEvents("cmpl-0f", 'dates "v2" 100%', 1700000000)
    for text, token in [(" 12", 5), ("", 0), ('é"\\\n%d', 123456), ("\0", 7)]:
        assert events.token(text, token) == sse(chunk_body("cmpl-0f", 'dates "v2" 100%', 1700000000, text, [token]))


def test_the_registry_gives_back_a_socket_path_or_a_port(tmp_path):
    registry = Registry(tmp_path)
    registry.announce(registry.socket_path())
    assert registry.read() == {os.getpid(): str(tmp_path / f"{os.getpid()}.sock")}
    registry.announce(8123)
    assert registry.read() == {os.getpid(): 8123}


def test_latency_histograms_observe_first_token_and_the_gaps_between_tokens():
    """A request submitted at 9.0 s whose tokens come at 10.0, 10.5, 11.5 and 13.0 s: time to
    first token 1.0 s; per output token the gaps 0.5, 1.0 and 1.5 s (sum 3.0, count 3)."""
    metrics = ServerMetrics(SimpleNamespace(queue_length=0, active_rows=0, parked_rows=0, state_bytes=0))
    req = Request([5, 6], SearchOptions(max_new_tokens=4), "r", submitted=9.0,
                  on_event=lambda r, token: metrics.on_token(r) if token is not None else metrics.on_end(r))
    for token, now in zip((7, 8, 9, 10), (10.0, 10.5, 11.5, 13.0)):
        req.take(token, now)
    assert req.finish_reason == "length"
    value = {s.name: s.value for family in metrics.registry.collect() for s in family.samples}
    assert value["seqexport_time_to_first_token_seconds_sum"] == 1.0
    assert value["seqexport_time_to_first_token_seconds_count"] == 1
    assert (value["seqexport_time_per_output_token_seconds_sum"],
            value["seqexport_time_per_output_token_seconds_count"]) == (3.0, 3)
    assert value["seqexport_generated_tokens_total"] == 4
