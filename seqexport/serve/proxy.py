"""Ray Serve's HTTP proxy, made to answer a client whose replica died: never a 500.

When a replica's process dies, Ray Serve's proxy answers the requests it was serving with
HTTP 500 (nothing sent yet) or cuts the connection (a stream under way), though the other
replicas are up. `ReplicaLoss`, an ASGI middleware in the proxy itself (no extra hop), sends
a request that got nothing back again (Ray's router has by then marked the dead replica, so
the retry goes to a live one), up to `RETRIES` times, then answers 503 with Retry-After; a
stream cut after its first bytes ends with an `error` event and `[DONE]`, which a client
can tell from a finished stream (it has no `finish_reason`).

The embedded default of `seqexport serve` installs it through Ray Serve's own hook, the
environment of the proxy's process:

    RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=seqexport.serve.proxy:middlewares

(set it likewise on every node's `ray start` to have it on a cluster).
"""

import asyncio
import json
import logging

from seqexport.serve.protocol import HTTPError, sse

CALLBACK = "seqexport.serve.proxy:middlewares"
RETRIES = 3  # times a request that got nothing back is sent again
BACKOFF_S = 0.2  # before the first retry; doubled each time

log = logging.getLogger(__name__)


def middlewares() -> list:
    """What Ray Serve's proxy calls (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH)."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaLoss)]


class ReplicaLoss:
    """ASGI middleware: an HTTP request the app answered with nothing (the replica died before
    its first byte) is sent again with the same body; a body cut after its first bytes is
    ended with an SSE error event (a stream) or the connection is dropped (anything else)."""

    def __init__(self, app, retries: int = RETRIES, backoff_s: float = BACKOFF_S):
        self.app, self.retries, self.backoff_s = app, retries, backoff_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = _Request(receive)
        if not await request.read_body():
            return  # the client left before it had sent its request
        for attempt in range(self.retries + 1):
            reply = _Reply(send)
            try:
                await self.app(dict(scope), request.replay(), reply.send)
            except Exception as e:  # Ray's proxy answers its own failures; treated as a lost replica
                log.warning("%s %s failed in the proxy: %r", scope["method"], scope["path"], e)
            if reply.complete or request.disconnected:
                return
            if reply.sent:
                return await reply.end_cut()
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * 2**attempt)
        busy = HTTPError(503, "no replica answered this request (one went away); retry", kind="server_busy")
        await _send_json(send, busy, {"retry-after": "1"})


class _Request:
    """The request's body, read once, replayed to each attempt; then the client's own events."""

    def __init__(self, receive):
        self._receive, self.body, self.disconnected = receive, [], False

    async def read_body(self) -> bool:
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                self.disconnected = True
                return False
            self.body.append(message)
            if not message.get("more_body", False):
                return True

    def replay(self):
        pending = list(self.body)

        async def receive():
            if pending:
                return pending.pop(0)
            message = await self._receive()  # from here only http.disconnect can come
            self.disconnected = self.disconnected or message["type"] == "http.disconnect"
            return message

        return receive


class _Reply:
    """One attempt's answer, its start held back until the body's first bytes: an attempt that
    sent no byte can be dropped and made again."""

    def __init__(self, send):
        self._send, self._start = send, None
        self.sent = self.complete = False
        self.streaming = False

    async def send(self, message) -> None:
        if message["type"] == "http.response.start":
            self._start = message
            self.streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                 for k, v in message.get("headers", []))
            return
        more = message.get("more_body", False)
        if message["type"] == "http.response.body" and not self.sent:
            if more and not message.get("body"):
                return  # nothing yet
            await self._send(self._start)
            self.sent = True
        await self._send(message)
        if message["type"] == "http.response.body" and not more:
            self.complete = True

    async def end_cut(self) -> None:
        if not self.streaming:
            raise ConnectionAbortedError("the replica went away in the middle of this response")
        cut = HTTPError(503, "the replica serving this stream went away; retry the request", kind="server_busy")
        await self._send({"type": "http.response.body", "body": sse(cut.body()) + sse("[DONE]"),
                          "more_body": False})


async def _send_json(send, error: HTTPError, headers: dict) -> None:
    body = json.dumps(error.body()).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})
