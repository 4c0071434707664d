"""`seqexport serve` stopped by SIGTERM (a service manager, a rolling update) or Ctrl-C while it answers:
no new connection is taken, what finishes within `--shutdown-grace` finishes, and every other
request ends with 503 "shutting down; retry" (a stream: that error event, [DONE] and the
body's proper end), then the process exits 143 (Ctrl-C: 130) with nothing of Ray left. Before, under
`--no-ray` a stream still running after uvicorn's 5 s was cut mid-body (no error event, no
[DONE], no chunked end), and the embedded default's Ray driver turned SIGTERM into a stack
dump and an abort (exit 134): every answer in progress was cut at once and nothing was cleaned
up."""

import json
import signal
import socket
import threading
import time

import pytest
import requests

import seqexport.runtime as rt
from seqexport.serve.process import ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own pydantic fields

GRACE_S = 3.0
PROMPT = "5 May 2021"
SHORT = 400  # tokens of the request that finishes within the grace (a fraction of a second here)


@pytest.fixture(scope="module")
def folder(bundled_exports):
    return bundled_exports("mamba")[1]


@pytest.fixture(scope="module")
def short_reference(folder) -> list[int]:
    model = rt.load(folder, provider="cpu", threads=1)
    return rt.generate(model, [model.encode(PROMPT)], rt.SearchOptions(max_new_tokens=SHORT, eos_id=-1))[0]


def completion(url: str, max_tokens: int, stream: bool) -> requests.Response:
    return requests.post(url + "/v1/completions", stream=stream, timeout=60,
                         json={"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                               "stream": stream})


def read_stream(r: requests.Response, out: dict, started: threading.Event) -> None:
    """Every event of an SSE answer, and how it ended: "[DONE]" after the body's proper end, or
    the exception a cut body raised."""
    events = []
    try:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                events.append(json.loads(line[6:]))
                started.set()
            elif line == b"data: [DONE]":
                out["done"] = True
        out["ended"] = "whole"
    except requests.RequestException as e:
        out["ended"] = repr(e)
    out["events"], out["at"] = events, time.monotonic()
    started.set()


@pytest.mark.parametrize("mode, sig, code", [("no-ray", signal.SIGTERM, 143), ("no-ray", signal.SIGINT, 130),
                                             ("embedded Ray", signal.SIGTERM, 143)],
                         ids=["no-ray SIGTERM", "no-ray Ctrl-C", "embedded Ray SIGTERM"])
def test_a_stop_finishes_what_the_grace_allows_ends_the_rest_with_503_then_exits_128_plus_the_signal(
        mode, sig, code, folder, short_reference, tmp_path):
    flags = ["--no-ray"] if mode == "no-ray" else ["--replica-cpus", "0.5"]
    log = tmp_path / "server.log"
    server = ServerProcess(folder, *flags, "--threads", "1", "--shutdown-grace", str(GRACE_S), ready_timeout=180,
                           log=log)
    with server:
        endless, started = {}, threading.Event()
        readers = [threading.Thread(target=read_stream, daemon=True,
                                    args=(completion(server.url, 10_000_000, True), endless, started))]
        readers[-1].start()
        whole = {}
        threading.Thread(target=lambda: whole.update(r=completion(server.url, 10_000_000, False)), daemon=True).start()
        assert started.wait(30), log.read_text()[-3000:]
        deadline = time.monotonic() + 30
        while requests.get(server.url + "/health", timeout=10).json()["active_rows"] < 2:
            assert time.monotonic() - deadline < 0, "the whole answer's request never ran"
            time.sleep(0.1)
        short, short_started = {}, threading.Event()
        readers.append(threading.Thread(target=read_stream, daemon=True,
                                        args=(completion(server.url, SHORT, True), short, short_started)))
        readers[-1].start()
        assert short_started.wait(30)
        stopped = time.monotonic()
        server.proc.send_signal(sig)
        time.sleep(0.5)
        with pytest.raises(OSError):  # no new connection is taken
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()

        server.proc.wait(GRACE_S + 30)
        assert server.proc.returncode == code, log.read_text()[-3000:]  # (Ctrl-C under --no-ray was 0)
        for reader in readers:  # what the server wrote before it exited may still be in the readers' hands
            reader.join(30)
        # what the grace allowed: the short stream, whole, generate()'s tokens
        assert short["ended"] == "whole" and short.get("done"), short.get("ended")
        assert [t for e in short["events"] for t in e["choices"][0]["token_ids"]] == short_reference
        assert short["events"][-1]["choices"][0]["finish_reason"] == "length"
        assert short["at"] - stopped < GRACE_S
        # the rest: the endless stream's error event, [DONE] and the body's end, after the grace
        assert endless["ended"] == "whole" and endless.get("done"), endless.get("ended")
        assert endless["events"][-1] == {"error": {"message": "the server is shutting down; retry",
                                                   "type": "server_busy", "param": None, "code": 503}}
        assert len(endless["events"]) > 2
        assert GRACE_S - 0.5 < endless["at"] - stopped < GRACE_S + 5
        # and the whole answer a 503 to retry
        r = whole["r"]
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text[:300]
        assert r.json()["error"]["message"] == "the server is shutting down; retry"
    assert not server.session_pids()  # Ray's processes went with the server
    assert "SIGTERM received" not in log.read_text()  # (Ray's stack dump before the abort)


def test_a_request_that_reaches_a_stopped_engine_gets_503_to_retry_not_500(folder):
    """Past the grace the engine is closed first; a request that reaches it after (one that was
    still arriving) is refused as the server's others are, not with the engine's UsageError
    (which the app answered as a 500)."""
    import asyncio

    from seqexport.serve.app import Listener, ServeConfig, ServingHost
    from seqexport.serve.protocol import HTTPError, parse_completion

    host = ServingHost(ServeConfig(str(folder)))
    host.close()
    loop = asyncio.new_event_loop()
    try:
        params = parse_completion(json.dumps({"prompt": PROMPT, "max_tokens": 4}).encode())
        with pytest.raises(HTTPError) as e:
            host.submit(params, Listener(host, [], loop))
    finally:
        loop.close()
    assert e.value.status == 503 and e.value.headers == {"Retry-After": "1"}
    assert "shutting down" in str(e.value.body())
