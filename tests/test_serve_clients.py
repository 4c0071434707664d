"""Slow, idle, stalled and too many clients (seqexport.serve.clients), and bytes that are not
HTTP, over real sockets, on both of `serve`'s HTTP servers: uvicorn (`serve --no-ray`, a
subprocess) and the embedded default's front (in this process, over a `serve --no-ray`
replica). Before, no client was timed out: a half-sent request or an idle connection was held
for good, a client that stopped reading its stream kept its row, and 250 of them past an
open-file limit of 200 locked new clients out; bytes that were not HTTP got plain text
(uvicorn) or a closed connection (the front)."""

import contextlib
import http.client
import json
import select
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import seqexport.runtime as rt
from seqexport.serve.app import HOLD_AT
from seqexport.serve.clients import ClientLimits
from seqexport.serve.front import Front
from seqexport.serve.process import ServerProcess, free_port
from tests.raw_http import PrefixedSocket, read_response

TIMEOUT_S = 1.0
MAX_CONNECTIONS = 6
SLACK_S = 1.5  # the sweep's period (a quarter of the timeout here) and a loaded machine's delays


@pytest.fixture(scope="module")
def folder(bundled_exports):
    return bundled_exports("mamba")[1]


@pytest.fixture(scope="module")
def replica(folder):
    with ServerProcess(folder, "--no-ray", "--threads", "1", "--max-rows", "8") as server:
        yield server


@pytest.fixture(scope="module")
def plain(folder):
    with ServerProcess(folder, "--no-ray", "--threads", "1", "--max-rows", "8", "--client-timeout", str(TIMEOUT_S),
                       "--max-connections", str(MAX_CONNECTIONS)) as server:
        yield server


@pytest.fixture(scope="module")
def front(replica, tmp_path_factory):
    registry = tmp_path_factory.mktemp("replicas")
    (registry / str(replica.proc.pid)).write_text(str(replica.port))
    f = Front(registry, "127.0.0.1", free_port(), limits=ClientLimits(TIMEOUT_S, MAX_CONNECTIONS)).start()
    yield f
    f.close()


@pytest.fixture(params=["uvicorn", "front"])
def server(request, replica):
    """(port, the replica's /health URL: its rows) of the server under test."""
    if request.param == "uvicorn":
        s = request.getfixturevalue("plain")
        return s.port, s.url + "/health"
    return request.getfixturevalue("front").port, replica.url + "/health"


def body(max_tokens=4, stream=False) -> bytes:
    return json.dumps({"prompt": "5 May 2021", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
                       "ignore_eos": True}).encode()


def head(length: int) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % length)


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    return s


def read_until_closed(s: socket.socket) -> bytes:
    data = b""
    while more := s.recv(65536):
        data += more
    return data


def rows(health: str) -> int:
    with urllib.request.urlopen(health, timeout=10) as r:
        return json.load(r)["active_rows"]


def wait_rows(health: str, n: int, seconds: float) -> float:
    """Seconds until the replica runs `n` rows (fails past `seconds`)."""
    start = time.monotonic()
    while rows(health) != n:
        assert time.monotonic() - start < seconds, f"still {rows(health)} rows after {seconds} s"
        time.sleep(0.1)
    return time.monotonic() - start


def request_ok(port: int) -> None:
    with connect(port) as s:
        payload = body()
        s.sendall(head(len(payload)) + payload)
        status, answer, _ = read_response(s)
        assert status == 200 and answer["choices"][0]["text"], answer


@pytest.mark.parametrize("sent", ["half a head", "a head and half its body", "a body trickled",
                                  "a refused body's rest"])
def test_a_request_that_does_not_arrive_whole_in_time_gets_408_then_the_connection_closes(server, sent):
    port, _ = server
    payload = body()
    start = time.monotonic()  # before the connection: the server's clock starts when it accepts it
    with connect(port) as s:
        if sent == "half a head":
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        elif sent == "a head and half its body":
            s.sendall(head(len(payload)) + payload[:10])
        elif sent == "a body trickled":  # a byte every tenth of a second: never idle, never whole in time
            s.sendall(head(len(payload)))
            for byte in payload[:-1]:
                if select.select([s], [], [], 0.1)[0]:  # answered: no more bytes (they would reset it)
                    break
                s.sendall(bytes([byte]))
        else:  # over the body limit by its Content-Length: 413 at once, then its rest is waited for
            s.sendall(head(5 << 20) + b"{")
            assert read_response(s)[0] == 413
        status, error, rest = read_response(s)
        assert rest + read_until_closed(s) == b""
        took = time.monotonic() - start
    assert status == 408 and error["error"]["type"] == "request_timeout"
    assert "did not arrive whole within 1 s" in error["error"]["message"]
    assert TIMEOUT_S <= took < TIMEOUT_S + SLACK_S + (len(payload) * 0.1 if sent == "a body trickled" else 0)
    request_ok(port)


@pytest.mark.parametrize("before", ["nothing", "a request answered"])
def test_an_idle_connection_closes_after_the_timeout_with_no_answer(server, before):
    port, _ = server
    with connect(port) as s:
        if before == "a request answered":
            payload = body()
            s.sendall(head(len(payload)) + payload)
            assert read_response(s)[0] == 200
        start = time.monotonic()
        assert read_until_closed(s) == b""
        assert TIMEOUT_S * 0.9 <= time.monotonic() - start < TIMEOUT_S + SLACK_S


def test_no_ray_keeps_an_idle_keep_alive_connection_for_the_client_timeout_not_uvicorns_5_s(folder):
    """Under --no-ray, uvicorn closed an idle keep-alive connection after its own 5 s, whatever
    --client-timeout said (the front keeps it for the timeout): a client that reused its
    connection 6 s later found it closed, or raced the close."""
    with ServerProcess(folder, "--no-ray", "--threads", "1", "--client-timeout", "8") as server, \
            connect(server.port) as s:
        payload = body()
        s.sendall(head(len(payload)) + payload)
        assert read_response(s)[0] == 200
        time.sleep(6.5)
        s.sendall(head(len(payload)) + payload)  # the same connection, idle for 6.5 s
        assert read_response(s)[0] == 200
        start = time.monotonic()
        assert read_until_closed(s) == b""
        assert 8 * 0.9 <= time.monotonic() - start < 8 + SLACK_S + 2


def test_a_slow_client_within_the_timeout_is_served(server):
    """The clock runs from the connection being ready for a request, not from its last byte, and
    a request answered sets it again: a request sent over 0.6 s, then another after 0.6 s idle."""
    port, _ = server
    payload = body()
    with connect(port) as s:
        for _ in range(2):
            time.sleep(0.6 * TIMEOUT_S)
            whole = head(len(payload)) + payload
            for k in range(0, len(whole), len(whole) // 4 + 1):
                s.sendall(whole[k:k + len(whole) // 4 + 1])
                time.sleep(0.05)
            assert read_response(s)[0] == 200


@contextlib.contextmanager
def long_stream(port: int, health: str):
    """A socket with a small receive buffer, streaming ten million tokens (a Mamba has no
    positional limit: the row runs until its client is cut or hangs up) once its row runs;
    closed after."""
    wait_rows(health, 0, 30)
    with connect(port, rcvbuf=4096) as s:
        payload = body(max_tokens=10_000_000, stream=True)
        s.sendall(head(len(payload)) + payload)
        wait_rows(health, 1, 10)
        yield s


def test_a_client_that_takes_none_of_its_stream_is_cut_and_its_row_freed(server):
    """Once the socket's buffers are full (about 5 s here), the row of a client that reads
    nothing is freed within the timeout."""
    port, health = server
    with long_stream(port, health):
        freed_after = wait_rows(health, 0, 20)
    assert freed_after < 15
    request_ok(port)


def test_a_client_reading_its_stream_slowly_is_not_cut(server):
    """A client taking 1 KB every tenth of a second, once the socket's buffers are full (about
    5 s here: a client reading nothing is cut about 6 s in), keeps the server's writing paused
    for longer than the timeout, and the transport's buffer unchanged (it moves into the
    kernel's in large steps), yet takes some of its answer at every look: it is not cut."""
    port, health = server
    with long_stream(port, health) as s:
        end = time.monotonic() + 8 + 4 * TIMEOUT_S
        while time.monotonic() < end:
            assert s.recv(1024), "cut"
            time.sleep(0.1)
        assert rows(health) == 1
    wait_rows(health, 0, 20)


STREAM_TOKENS = 20_000  # more than every buffer between uvicorn's model and a client holds (~14,000 here)


@pytest.fixture(scope="module")
def reference(folder) -> list[int]:
    """The stream's tokens by generate() in this process: the model alone, no server."""
    model = rt.load(folder, provider="cpu", threads=1)
    return rt.generate(model, [model.encode("5 May 2021")], rt.SearchOptions(max_new_tokens=STREAM_TOKENS,
                                                                              eos_id=-1))[0]


def metric(health: str, name: str) -> float | None:
    with urllib.request.urlopen(health.replace("/health", "/metrics"), timeout=10) as r:
        lines = r.read().decode().splitlines()
    return next((float(line.split()[1]) for line in lines if line.startswith(name + " ")), None)


def read_slowly_until_parked(answer, health: str, seconds: float) -> bytes:
    """Read 1 KB every tenth of a second (10 KB/s) until the row is parked: the bytes read."""
    got, start = b"", time.monotonic()
    while metric(health, "seqexport_parked_rows") != 1:
        assert time.monotonic() - start < seconds, f"the slow reader's row was not held ({rows(health)} rows)"
        got += answer.read(1024)
        time.sleep(0.1)
    return got


def read_slowly_until_held(answer, health: str, seconds: float) -> tuple[bytes, float, float]:
    """Read at 10 KB/s until the row is parked, two seconds more, and on until it is parked
    again: (the bytes read, tokens generated when it was first parked, and at the end). While
    the client reads, its row may resume for a moment: the buffers between move in large steps,
    and one step can bring it within RESUME_AT tokens (CI once looked at just such a moment).
    The reads go on meanwhile: a client taking nothing for a second is cut (TIMEOUT_S)."""
    got = read_slowly_until_parked(answer, health, seconds)
    at_hold = metric(health, "seqexport_generated_tokens_total")
    for _ in range(20):
        got += answer.read(1024)
        time.sleep(0.1)
    got += read_slowly_until_parked(answer, health, 10)
    assert rows(health) == 1  # parked, its place kept
    return got, at_hold, metric(health, "seqexport_generated_tokens_total")


# Tokens a parked row may generate while its client reads 10 KB/s for two seconds and more
# (about 45 tokens' events a second): each step of the buffers between that brings the client
# within RESUME_AT lets its row generate up to HOLD_AT - RESUME_AT more. A row that is not
# held generates thousands in those seconds (about 2,400 a second here).
RUN_ON = 3 * HOLD_AT


def stream(port: int, max_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.sock = connect(port, rcvbuf=4096)
    conn.request("POST", "/v1/completions", body(max_tokens=max_tokens, stream=True),
                 {"content-type": "application/json"})
    return conn, conn.getresponse()


def test_a_slow_readers_row_is_held_not_run_ahead_and_its_stream_comes_whole(plain, reference):
    """A client reading 10 KB/s of a 20,000-token stream: once every buffer between the model
    and it is full, its row is parked and the model writes no further ahead of it (before, all
    20,000 tokens were generated within seconds and piled up in the server's memory); read
    fast, it resumes, and the stream comes whole: generate()'s tokens in order."""
    health = plain.url + "/health"
    wait_rows(health, 0, 30)
    before = metric(health, "seqexport_generated_tokens_total")
    conn, answer = stream(plain.port, STREAM_TOKENS)
    got, at_hold, later = read_slowly_until_held(answer, health, 30)
    assert at_hold <= later <= at_hold + RUN_ON and later - before < STREAM_TOKENS, (before, at_hold, later)
    got += answer.read()  # the rest as fast as it comes
    conn.close()
    events = [json.loads(e[6:]) for e in got.decode().split("\n\n") if e.startswith("data: {")]
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == reference
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert metric(health, "seqexport_parked_rows") == 0


def test_a_slow_reader_is_held_back_through_the_front_too(front, replica):
    """The front relays no faster than its client reads (it reads the replica's answer only as
    its client takes it), so the replica's row is parked as well; a hang-up frees it."""
    health = replica.url + "/health"
    wait_rows(health, 0, 30)
    conn, answer = stream(front.port, 10_000_000)
    _, at_hold, later = read_slowly_until_held(answer, health, 60)
    assert at_hold <= later <= at_hold + RUN_ON, (at_hold, later)
    conn.close()
    wait_rows(health, 0, 10)


def test_past_max_connections_the_longest_idle_makes_room_then_503_when_all_are_answered(server):
    port, health = server
    wait_rows(health, 0, 30)
    idle = []
    for _ in range(MAX_CONNECTIONS):
        idle.append(connect(port))
        time.sleep(0.05)  # each waiting a little less long than the one before
    try:
        request_ok(port)  # a seventh: the first idle one made room for it
        idle[0].settimeout(5)
        assert idle[0].recv(100) == b""  # closed, with no answer (it had sent nothing)
        for s in idle[1:]:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):  # still open: nothing to read, no EOF
                s.recv(100)
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    busy = []
    try:  # every connection with a request being answered: nothing to make room with
        for k in range(MAX_CONNECTIONS):
            if k == MAX_CONNECTIONS - 1:  # /health's connection (uvicorn's own) no longer needed
                wait_rows(health, MAX_CONNECTIONS - 1, 10)
            s = connect(port)
            payload = body(max_tokens=100_000)  # answered whole at the end: nothing written until then
            s.sendall(head(len(payload)) + payload)
            busy.append(s)
        time.sleep(0.5)  # the last request read whole
        with connect(port) as s:
            status, error, _ = read_response(s)
            assert read_until_closed(s) == b""
        assert status == 503 and error["error"]["type"] == "server_busy"
        assert f"holds {MAX_CONNECTIONS} connections" in error["error"]["message"]
    finally:
        for s in busy:
            s.close()
        wait_rows(health, 0, 30)  # the hung-up requests' rows freed
    request_ok(port)


def test_slow_clients_past_the_open_file_limit_do_not_lock_new_ones_out(folder):
    """`serve --no-ray` under an open-file limit of 200 and the default connection limit (what
    the open-file limit leaves): 250 connections each sending half a head. Before, new clients
    were reset while those were held; now each new one closes the oldest waiting one."""
    server = ServerProcess(folder, "--no-ray", "--threads", "1", "--client-timeout", "30")
    server.args = ["prlimit", "--nofile=200", "--", *server.args]
    with server:
        slow = []
        try:
            for _ in range(250):
                s = connect(server.port)
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
                slow.append(s)
            for _ in range(5):
                start = time.monotonic()
                request_ok(server.port)
                assert time.monotonic() - start < 5  # at once, not after a client timeout
            out = subprocess.run(["ls", f"/proc/{server.proc.pid}/fd"], capture_output=True, text=True).stdout
            assert len(out.split()) < 200
        finally:
            for s in slow:
                s.close()


def test_client_limits_apply_to_serves_own_front_only(folder, tmp_path):
    from click.testing import CliRunner

    from seqexport.cli import cli

    config = tmp_path / "serve.yaml"
    # --config-out first: were the options taken, it writes its file and exits at once (the
    # others would start a server)
    for extra in (["--config-out", str(config)], ["--address", "auto"], ["--autoscale", "1:2"]):
        result = CliRunner().invoke(cli, ["serve", str(folder), "--client-timeout", "5", "--max-connections", "9",
                                          *extra])
        assert result.exit_code == 2, result.output
        assert "--client-timeout and --max-connections: held by `serve`'s own front" in result.output
        assert not config.exists()
    result = CliRunner().invoke(cli, ["serve", str(folder), "--client-timeout", "0"])
    assert result.exit_code == 2 and "--client-timeout" in result.output
    result = CliRunner().invoke(cli, ["serve", str(folder), "--shutdown-grace", "3", "--config-out", str(config)])
    assert result.exit_code == 2 and "--shutdown-grace: held by `serve`'s own front" in result.output
    assert not config.exists()



NOT_HTTP = {
    "no method": (b"GARBAGE\r\n\r\n", "Invalid method encountered"),
    "a negative length": (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: -5\r\n\r\n",
                          "Invalid character in Content-Length"),
    "two lengths": (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                    "Duplicate Content-Length"),
    "a bad chunk": (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                    "Invalid character in chunk size"),
    "HTTP/9.9": (b"GET /health HTTP/9.9\r\n\r\n", "Invalid HTTP version"),
}


@pytest.mark.parametrize("case", list(NOT_HTTP))
def test_bytes_that_are_not_http_get_400_json_naming_why_then_the_connection_closes(server, case):
    port, _ = server
    raw, why = NOT_HTTP[case]
    with connect(port) as s:
        s.sendall(raw)
        status, error, rest = read_response(s)
        assert rest + read_until_closed(s) == b""
    assert status == 400 and error["error"]["message"] == f"malformed HTTP request: {why}", error
    request_ok(port)


@pytest.mark.parametrize("after", ["bytes that are not HTTP", "a head past 64 KiB"])
def test_the_requests_before_a_connection_ending_error_are_answered_first(server, after):
    """Pipelined: the requests before the bad bytes are answered, in turn, then the 400 or 431
    (uvicorn sent its answer at once, and theirs were lost)."""
    port, _ = server
    payload = body(max_tokens=30)
    bad, status, words = (b"GARBAGE\r\n\r\n", 400, "Invalid method") if after == "bytes that are not HTTP" else \
        (b"GET /health HTTP/1.1\r\nx-big: " + b"a" * (1 << 20), 431, "over 65536 bytes")  # (a read past)
    with connect(port) as s:
        s.sendall((head(len(payload)) + payload) * 2 + bad)
        statuses, rest = [], b""
        for _ in range(3):
            code, answer, rest = read_response(PrefixedSocket(s, rest))
            statuses.append(code)
        assert statuses == [200, 200, status] and words in answer["error"]["message"]
        assert rest + read_until_closed(s) == b""


def test_a_websocket_upgrade_is_answered_as_plain_http_then_the_connection_closes(server):
    port, _ = server
    with connect(port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\nxx")
        status, health, rest = read_response(s)
        answered = time.monotonic()
        assert status == 200 and health["status"] == "ok"
        assert rest + read_until_closed(s) == b""
        assert time.monotonic() - answered < 0.5 * TIMEOUT_S  # closed after the answer, not idle


def test_max_connections_past_the_open_file_limit_raises_it_or_is_refused(folder):
    """Asked for more connections than the open-file limit leaves, `serve` raises its soft limit
    (up to the hard one) before it loads the model, or exits 2 naming both; it held the
    connections past the limit before, and accept() reset the clients past it."""
    command = [sys.executable, "-m", "seqexport.cli", "serve", str(folder), "--no-ray", "--max-connections", "1000"]
    out = subprocess.run(["prlimit", "--nofile=200:300", "--", *command], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert "--max-connections 1000: the open-file limit (soft 200, hard 300) leaves room for" in out.stderr
    assert "Traceback" not in out.stderr
    server = ServerProcess(folder, "--no-ray", "--threads", "1", "--max-connections", "1000")
    server.args = ["prlimit", "--nofile=200:4096", "--", *server.args]
    with server:
        limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
        soft = int(next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3])
        assert 1000 < soft <= 4096
        held = []
        try:
            for _ in range(400):  # past the old limit of 200: every one held, none closed for room
                held.append(connect(server.port))
            request_ok(server.port)
            for s in held:
                s.setblocking(False)
                with pytest.raises(BlockingIOError):
                    s.recv(100)
        finally:
            for s in held:
                s.close()
