"""Requests no polite client sends, over a raw socket: a huge body (declared or chunked), a huge
header line, many requests pipelined on one connection. Used by the serving tests to check that
a server refuses what it must not hold, as it arrives, and answers the rest."""

import json
import socket

MB = 1 << 20


def peak_rss(pid: int | str = "self", reset: bool = False) -> int:
    """The most bytes a process has had resident (Linux's VmHWM), since it started or since the
    last `reset` (which sets the mark to what is resident now): a buffer held and freed again
    between two looks still shows."""
    if reset:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def read_response(sock: socket.socket) -> tuple[int, dict | None, bytes]:
    """One response read whole (its Content-Length): status, its JSON body (None if not JSON),
    and what was read past it."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError(f"the server closed after {data[:200]!r}")
        data += more
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = next(int(v) for n, v in (line.split(b":", 1) for line in lines[1:]) if n.strip().lower() == b"content-length")
    while len(rest) < length:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("the server closed mid-body")
        rest += more
    body = rest[:length]
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    return int(lines[0].split()[1]), parsed, rest[length:]


def send(port: int, head: bytes, pieces, timeout: float = 60.0) -> tuple[int, dict | None, bool]:
    """Send `head` then each of `pieces` (bytes), then read one response: (status, JSON body,
    whether every piece went out before the server answered or closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sent_all = True
        try:
            sock.sendall(head)
            for piece in pieces:
                sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            sent_all = False
        status, body, _ = read_response(sock)
        return status, body, sent_all


def post_head(length: int | None, extra: bytes = b"") -> bytes:
    framing = b"content-length: %d\r\n" % length if length is not None else b"transfer-encoding: chunked\r\n"
    return b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + extra + framing + b"\r\n"


def big_body(port: int, mb: int, chunked: bool = False) -> tuple[int, dict | None, bool]:
    """A body of `mb` MiB of spaces, with a Content-Length or chunked (a chunk a MiB)."""
    piece = b" " * MB
    if chunked:
        return send(port, post_head(None), [b"%x\r\n%s\r\n" % (MB, piece)] * mb + [b"0\r\n\r\n"])
    return send(port, post_head(mb * MB), [piece] * mb)


def big_header(port: int, mb: int) -> tuple[int, dict | None, bool]:
    """A header line of `mb` MiB, then a small body."""
    return send(port, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-big: ",
                [b"a" * MB] * mb + [b"\r\ncontent-length: 2\r\n\r\n{}"])


def exact_body(port: int, size: int, prompt: str) -> tuple[int, dict | None, bool]:
    """A valid completion request padded with JSON whitespace to exactly `size` bytes."""
    core = json.dumps({"prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    return send(port, post_head(size), [core + b" " * (size - len(core))])


def pipelined(port: int, prompts: list[str], max_tokens: int = 4, pad: int = 0,
              timeout: float = 120.0) -> list[tuple[int, dict | None]]:
    """Every request written at once on one connection (each body padded with `pad` bytes of
    JSON whitespace: more than one read of the server's), then every answer read in order."""
    requests = []
    for p in prompts:
        body = json.dumps({"prompt": p, "max_tokens": max_tokens, "temperature": 0}).encode() + b" " * pad
        requests.append(post_head(len(body)) + body)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"".join(requests))
        out, rest = [], b""
        for _ in prompts:
            status, body, rest = read_response(PrefixedSocket(sock, rest))
            out.append((status, body))
        return out


class PrefixedSocket:
    """A socket whose first recv returns bytes already read past the previous response."""

    def __init__(self, sock, first: bytes):
        self.sock, self.first = sock, first

    def recv(self, n: int) -> bytes:
        if self.first:
            data, self.first = self.first, b""
            return data
        return self.sock.recv(n)


def oversized_requests_are_refused_as_they_arrive(port: int, pid: int | str, max_prompt: int) -> None:
    """What a server (or the front) must do with requests it must not hold: 300 MB bodies
    (declared, and chunked) refused with 413 JSON, a 300 MB header line with 431 JSON, its
    peak memory growing by a few MB at most (it grew by the whole size before); the body limit is
    64 bytes a prompt token and at least 1 MiB, to the byte; and it still answers after."""
    limit = max(1 << 20, 64 * max_prompt)
    before = peak_rss(pid, reset=True)
    for status, body, _ in (big_body(port, 300), big_body(port, 300, chunked=True)):
        assert status == 413 and body["error"]["code"] == 413, body
        assert f"over this server's limit of {limit} bytes" in body["error"]["message"]
    status, body, _ = big_header(port, 300)
    assert status == 431 and body["error"]["message"] == "request line and headers: over 65536 bytes"
    assert peak_rss(pid) - before < 64 << 20
    status, body, _ = exact_body(port, limit, "5 May 2021")
    assert status == 200 and body["choices"][0]["text"], body
    status, body, _ = exact_body(port, limit + 1, "5 May 2021")
    assert status == 413 and f"{limit + 1} bytes, over this server's limit of {limit} bytes" in body["error"]["message"]
