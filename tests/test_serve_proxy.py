"""`seqexport.serve.proxy.ReplicaLoss`, the middleware the embedded default puts in Ray Serve's
HTTP proxy, over a stand-in for the proxy that loses its replica as Ray's does: it returns
without a byte sent (the proxy's HTTP 500), or stops a body half-way (a cut connection).
The same over a real Ray Serve: tests/test_serve_ray.py kills a replica under load."""

import asyncio
import json

from seqexport.serve.protocol import sse
from seqexport.serve.proxy import ReplicaLoss

BODY = b'{"prompt": "5 May", "stream": true}'


class Proxy:
    """Ray's proxy as an ASGI app: attempt k plays `plans[k]`: "lost" sends nothing, "start"
    only the response start, "cut" the start and one event, "ok" a whole answer."""

    def __init__(self, *plans: str, content_type: bytes = b"text/event-stream"):
        self.plans, self.bodies, self.content_type = list(plans), [], content_type

    async def __call__(self, scope, receive, send):
        self.bodies.append((await receive())["body"])  # each attempt gets the request again
        plan = self.plans.pop(0)
        if plan == "lost":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", self.content_type)]})
        if plan == "start":
            return
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await send({"type": "http.response.body", "body": sse({"text": "2021"}), "more_body": plan != "ok"})


def call(app, disconnect_after: int | None = None) -> tuple[list[dict], bool]:
    """Run one request through ReplicaLoss(app): (messages sent to the client, whether it raised)."""
    sent, received = [], [0]

    async def receive():
        received[0] += 1
        if received[0] == 1:
            return {"type": "http.request", "body": BODY, "more_body": False}
        if disconnect_after is not None and received[0] > disconnect_after:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    async def run():
        middleware = ReplicaLoss(app, retries=2, backoff_s=0.001)
        try:
            await middleware({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []},
                             receive, send)
        except ConnectionAbortedError:
            return True
        return False

    raised = asyncio.run(run())
    return sent, raised


def body(sent) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_request_that_got_nothing_back_is_sent_again_with_its_body():
    app = Proxy("lost", "start", "ok")
    sent, _ = call(app)
    assert app.bodies == [BODY] * 3
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200]  # one answer, no 500
    assert body(sent) == sse({"text": "2021"}) and sent[-1]["more_body"] is False


def test_past_its_retries_the_client_gets_503_with_retry_after():
    sent, _ = call(Proxy("lost", "lost", "lost"))
    start = sent[0]
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert json.loads(body(sent))["error"]["type"] == "server_busy"


def test_a_stream_cut_after_its_first_bytes_ends_with_an_error_event_and_done():
    app = Proxy("cut", "ok")
    sent, raised = call(app)
    assert len(app.bodies) == 1 and not raised  # never sent twice: the client has part of it
    events = [e for e in body(sent).decode().split("\n\n") if e]
    assert events[0] == 'data: {"text": "2021"}' and events[-1] == "data: [DONE]"
    assert json.loads(events[1][len("data: "):])["error"]["code"] == 503
    assert sent[-1]["more_body"] is False


def test_another_body_cut_after_its_first_bytes_drops_the_connection():
    sent, raised = call(Proxy("cut", "ok", content_type=b"application/json"))
    assert raised and sent[-1]["more_body"] is True  # never ended as if whole


def test_a_client_gone_is_not_retried():
    app = Proxy("lost", "ok")

    async def leaves_at_once(scope, receive, send):
        await app(scope, receive, send)
        await receive()  # Ray's proxy reads on; here it is told the client left

    sent, _ = call(leaves_at_once, disconnect_after=1)
    assert len(app.bodies) == 1 and sent == []
