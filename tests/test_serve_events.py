"""The stream's token events from a template are the bytes `sse(chunk_body(...))` writes; the
replicas' registry holds a Unix socket's path or a port, and gives back which."""

import os

from seqexport.serve.front import Registry
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
