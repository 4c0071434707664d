"""`seqexport serve`'s embedded default: a front that relays HTTP to replicas answering it themselves.

Through Ray Serve's proxy every request crosses three processes (proxy -> replica through
Ray's core worker, the body fetched back, the answer streamed back): about 8-9 ms of CPU a
request, most of it in Ray's native actor calls, which on two cores capped the path near
180 requests a second. With the front, each replica (still a Ray Serve deployment: Ray
starts, health-checks and restarts it) also serves its app over HTTP on 127.0.0.1, announces
its port in a folder (`Registry`), and `Front`, in the `seqexport serve` process, relays each
request's bytes to the replica with the fewest in flight: no Ray on the request's path. It
keeps ReplicaLoss's promise: a request that got nothing back from a replica that died is sent
again to a live one (503 with Retry-After past RETRIES), a stream cut after its first bytes
ends with an error event and [DONE].
"""

import asyncio
import logging
from pathlib import Path

import httptools  # (the front runs only under `serve`, whose extra brings it with uvicorn)

from seqexport.serve.clients import ENDING_S, ClientLimits
from seqexport.serve.protocol import (
    MIN_BODY_LIMIT,
    HeadBytes,
    HTTPError,
    body_too_large,
    head_too_large,
    malformed,
    raw_response,
    shutting_down,
    sse,
)
from seqexport.serve.proxy import BACKOFF_S, RETRIES

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the front reads the registry for replicas Ray (re)started
PIPELINED = 16  # requests read ahead on one connection; past them its reading waits
LINGER_S = 5.0  # how long a connection ended mid-request reads and drops its client's bytes (_Client._end)
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"expect",
              b"proxy-connection", b"te", b"upgrade", b"trailer"}


class Registry:
    """Replicas on this machine that answer HTTP themselves: a folder of files, each named by a
    replica's pid and holding its address: a Unix socket's path (a replica's, in this folder), or
    a port on 127.0.0.1."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def announce(self, address: int | str) -> None:
        import os

        tmp = self.folder / f".{os.getpid()}.tmp"
        tmp.write_text(str(address))
        os.replace(tmp, self.folder / str(os.getpid()))

    def socket_path(self) -> str:
        """Where this process's replica listens: a Unix socket in the folder."""
        import os

        return str(self.folder / f"{os.getpid()}.sock")

    def read(self) -> dict[int, int | str]:
        """{pid: address} of the live replicas; a dead one's file is removed."""
        found = {}
        for entry in self.folder.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                text = entry.read_text()
                address = text if text.startswith("/") else int(text)
            except (OSError, ValueError):
                continue
            if _alive(int(entry.name)):
                found[int(entry.name)] = address
            else:
                entry.unlink(missing_ok=True)
                Path(self.folder / f"{entry.name}.sock").unlink(missing_ok=True)
        return found


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class _Replica:
    def __init__(self, pid: int, address: int | str):
        self.pid, self.address, self.inflight, self.idle = pid, address, 0, []

    async def connection(self):
        """(reader, writer, reused): an idle keep-alive connection, else a new one (OSError when refused)."""
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer, True
            writer.close()
        if isinstance(self.address, str):  # a Unix socket: a send and a read cost less than on TCP
            return *await asyncio.open_unix_connection(self.address), False
        return *await asyncio.open_connection("127.0.0.1", self.address), False

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class _Asked:
    __slots__ = ("method", "url", "version", "headers", "body", "keep_alive", "size", "refused")

    def __init__(self):
        self.url, self.headers, self.body = b"", [], []
        self.keep_alive = False  # read from the head once it is whole
        self.size = 0  # bytes of the body read so far
        self.refused: HTTPError | None = None  # answered by the front itself: too large

    def upstream(self) -> bytes:
        """The request as sent to a replica: HTTP/1.1, keep-alive, its body with a Content-Length."""
        body = b"".join(self.body)
        lines = [self.method + b" " + self.url + b" HTTP/1.1"]
        lines += [n + b": " + v for n, v in self.headers if n.lower() not in HOP_BY_HOP]
        if body or self.method not in (b"GET", b"HEAD", b"DELETE", b"OPTIONS"):
            lines.append(b"content-length: " + str(len(body)).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


class _Client(asyncio.Protocol):
    """One client connection (an asyncio protocol: no task or future a read): its requests,
    parsed as they arrive (httptools), answered one after another."""

    def __init__(self, front: "Front"):
        self.front, self.parser = front, httptools.HttpRequestParser(self)
        self.ready, self.current, self.gone, self.paused = [], None, False, False
        self.head, self.closing = HeadBytes(), False
        self.transport = self.task = self.upstream = self._drained = self.clock = None

    def connection_made(self, transport):
        self.transport = transport
        self.clock = self.front.limits.opened(transport)  # None: too many connections, 503 written
        if self.clock is None:
            self.gone = True
            return
        self.front.clients.add(self)

    def data_received(self, data):
        if self.clock is None or self.closing:  # refused, or ended after what it asked: nothing more read
            return
        ends = self.head.ends
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # (WebSocket) its request is answered as plain HTTP; past it, not HTTP
            self._stop_reading()
        except Exception as e:  # not HTTP (httptools names why): answered in turn, then the connection closes
            log.debug("front: a client's bytes: %r", e)
            self._end_with(malformed(e))
        if not self.closing and self.head.over(ends, len(data)):
            self._end_with(head_too_large())
        if len(self.ready) >= PIPELINED and not self.paused:  # a client far ahead of its answers
            self.paused = True
            self.transport.pause_reading()
        if self.ready and self.task is None:
            self.task = self.front._loop.create_task(self._serve())
            # held by the front: the loop keeps only a weak reference to a task, and a connection
            # paused for reading is no longer held by the loop either, so a task awaiting a
            # replica's connect was collected with its client mid-request (the client saw EOF)
            self.front._serving.add(self.task)
            self.task.add_done_callback(self.front._serving.discard)

    def connection_lost(self, exc):
        self.gone = True
        self.front.clients.discard(self)
        if self.clock is not None:
            self.clock.lost()
        if self.upstream is not None:
            self.upstream.close()  # the replica sees its client go: the row is freed
        self.resume_writing()

    def pause_writing(self):
        self._drained = self.front._loop.create_future()
        if self.clock is not None:
            self.clock.write_paused()

    def resume_writing(self):
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None
        if self.clock is not None:
            self.clock.write_resumed()

    def write(self, data: bytes) -> None:
        if data and not self.gone:
            self.transport.write(data)

    async def drain(self) -> None:
        if self._drained is not None:
            await self._drained

    def on_message_begin(self):
        self.current = _Asked()
        self.clock.began()

    # A request's head and body are held until they are whole, so each has a limit: past it the
    # request is answered by the front at once (431, 413), the rest of it read and dropped (a
    # 500 MB body or header was held whole before; the client now gets the answer once it reads).
    def on_url(self, url):
        self.current.url += url

    def on_header(self, name, value):
        self.current.headers.append((name, value))

    def _end_with(self, error: HTTPError) -> None:
        """A request the connection cannot go past (a head still unfinished past HEAD_LIMIT, see
        HeadBytes; bytes that are not HTTP): `error` in turn, nothing more read, then the
        connection closes."""
        r = _Asked() if self.current is None or self.current.refused is not None else self.current
        r.keep_alive = False
        self._refuse(r, error)
        self._stop_reading()

    def _stop_reading(self) -> None:
        """For good: the connection ends once what it asked for is answered."""
        if self.ready:
            self.ready[-1].keep_alive = False
        self.paused = self.closing = True
        self.transport.pause_reading()

    def _end(self) -> None:
        """Close once the answers are written. A connection whose reading stopped with bytes
        unread (a head too large, bytes that are not HTTP) is half-closed instead, the rest read
        and dropped until the client closes or LINGER_S pass (nginx's lingering close): closed
        with bytes unread, the kernel resets it, and a reset can drop the answers the client
        has not read yet (a client still sending a 1 MB header lost its 200s and its 431)."""
        if not self.closing or self.gone:
            self.transport.close()
            return
        self.transport.resume_reading()  # data_received drops what comes now
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.front._loop.call_later(LINGER_S, self.transport.close)

    def _refuse(self, r: _Asked, error: HTTPError) -> None:
        # (its Origin kept: the answer carries CORS headers for an allowed page, Front.cors)
        r.refused, r.url, r.body = error, b"", []
        r.headers = [(n, v) for n, v in r.headers if n.lower() == b"origin"]
        self.ready.append(r)  # answered in turn, without waiting for the rest of it
        self.clock.answering()

    def on_headers_complete(self):
        self.head.head_ended()
        r = self.current
        if r.refused is not None:  # its head was too large: answered as it is, then the connection closes
            return
        r.method, r.version, r.keep_alive = self.parser.get_method(), self.parser.get_http_version(), \
            self.parser.should_keep_alive()
        limit = self.front.body_limit
        length = next((v for n, v in r.headers if n.lower() == b"content-length"), b"")
        if length.isdigit() and int(length) > limit:
            self._refuse(r, body_too_large(limit, int(length)))
        elif any(n.lower() == b"expect" and v.lower() == b"100-continue" for n, v in r.headers):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body):
        r = self.current
        if r.refused is not None:
            return
        r.size += len(body)
        if r.size > self.front.body_limit:
            self._refuse(r, body_too_large(self.front.body_limit))
        else:
            r.body.append(body)

    def on_message_complete(self):
        self.head.message_ended()
        self.clock.ended()
        if self.current.refused is None:
            self.ready.append(self.current)
            self.clock.answering()

    async def _serve(self) -> None:
        try:
            while self.ready and not self.gone:
                request = self.ready.pop(0)
                if self.paused and not self.closing and len(self.ready) < PIPELINED:
                    self.paused = False
                    self.transport.resume_reading()
                if request.refused is not None:
                    self.write(raw_response(request.refused, close=not request.keep_alive,
                                            headers=self.front.cors(request)))
                    await self.drain()
                    if not request.keep_alive:
                        self._end()
                        return
                    continue
                if not await self.front._answer(self, request) or not request.keep_alive:
                    self._end()
                    return
        except Exception as e:  # a reset connection: this client only
            log.debug("front: client connection ended: %r", e)
            self.transport.close()
        finally:
            self.task = None
            if not self.ready:  # all answered: the next request must come within the client timeout
                self.clock.ready()


class _Relay:
    """A replica's answer, parsed (httptools) and relayed as it arrives: its head held back until
    the body's first bytes (an attempt that relayed nothing can be made again), a chunked body
    re-framed a chunk per piece (so a cut can be ended at a chunk's boundary), an SSE body relayed
    whole events at a time."""

    def __init__(self, client, head_only: bool, chunks_ok: bool):
        self.parser = httptools.HttpResponseParser(self)
        self.out, self.head_only, self.chunks_ok = client, head_only, chunks_ok
        self.reason, self.headers, self.pieces = b"", [], []
        self.head_done = self.complete = self.sent = self.sse = self.chunked = self.close = self.reused = False
        self.tail = b""

    def on_status(self, reason):
        self.reason += reason

    def on_header(self, name, value):
        self.headers.append((name, value))

    def on_headers_complete(self):
        self.head_done = True
        for n, v in self.headers:
            n = n.lower()
            if n == b"content-type" and v.startswith(b"text/event-stream"):
                self.sse = True
            elif n == b"transfer-encoding" and b"chunked" in v.lower():
                self.chunked = True
        if self.head_only:
            self.complete = True

    def on_body(self, body):
        self.pieces.append(body)

    def on_message_complete(self):
        self.complete = True

    def relay(self) -> None:
        """Write what has arrived, in one write: the head once there is body (or the end), the
        body, the chunked body's end (a write each cost a send here and a read at the client)."""
        if not self.head_done or (not self.sent and not self.complete and not any(self.pieces)):
            return
        out = [] if self.sent else [self._head()]
        data, self.pieces = b"".join(self.pieces), []
        if self.sse and not self.complete:  # whole events only, so a cut never splits one
            data = self.tail + data
            cut = data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
            data, self.tail = data[:cut], data[cut:]
        elif self.tail:
            data, self.tail = self.tail + data, b""
        out.append(self._framed(data))
        if self.complete and self.chunked and not self.close:
            out.append(b"0\r\n\r\n")
        self.out.write(b"".join(out))

    def _head(self) -> bytes:
        self.sent = True
        self.close = self.chunked and not self.chunks_ok  # an HTTP/1.0 client: the body until close
        lines = [b"HTTP/1.1 %d %s" % (self.parser.get_status_code(), self.reason)]
        lines += [n + b": " + v for n, v in self.headers
                  if n.lower() not in (b"connection", b"keep-alive", b"transfer-encoding")]
        if self.chunked and not self.close:
            lines.append(b"transfer-encoding: chunked")
        if self.close or not self.chunks_ok or self.out.front.stopping:
            lines.append(b"connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def _framed(self, data: bytes) -> bytes:
        if data and self.chunked and not self.close:
            return b"%x\r\n%s\r\n" % (len(data), data)
        return data

    def end_cut(self, cut: HTTPError | None = None) -> bool:
        """The replica went away after the body began (or the front is stopping: `cut`): an SSE
        stream ends with an error event and [DONE]; anything else is cut (False: the client's
        connection must close)."""
        if not self.sse:
            return False
        cut = cut or HTTPError(503, "the replica serving this stream went away; retry the request", kind="server_busy")
        end = b"0\r\n\r\n" if self.chunked and not self.close else b""
        self.out.write(self._framed(sse(cut.body()) + sse("[DONE]")) + end)
        return not self.close


class Front:
    """`seqexport serve`'s HTTP on HOST:PORT for replicas that answer HTTP themselves (found in
    `registry`), on a thread of its own with its own event loop:

        front = Front(folder, "127.0.0.1", 8000).start()    # listening once it returns
        ...
        front.close()
    """

    def __init__(self, registry, host: str, port: int, retries: int = RETRIES, backoff_s: float = BACKOFF_S,
                 body_limit: int = MIN_BODY_LIMIT, limits: ClientLimits | None = None,
                 allow_origins: list[str] | None = None):
        self.registry = Registry(registry)
        self.body_limit = body_limit  # protocol.body_limit of the replicas' max_prompt_tokens
        self.limits = limits or ClientLimits()  # how long a client may take, how many are held
        self.allow_origins = allow_origins  # the replicas' --allow-origin, for the answers the front writes
        self.host, self.port, self.retries, self.backoff_s = host, port, retries, backoff_s
        self.replicas: dict[int, _Replica] = {}
        self._turn = 0
        self._loop = self._server = self._thread = None
        self._serving: set[asyncio.Task] = set()  # the clients' running _serve tasks
        self.clients: set[_Client] = set()  # the open connections
        self.stopping = False  # close() has begun: no new connections, no new requests relayed

    def start(self) -> "Front":
        import threading

        started, failed = threading.Event(), []

        def run():
            try:
                import uvloop

                loop = uvloop.new_event_loop()
            except ImportError:
                loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(loop.create_server(lambda: _Client(self), self.host,
                                                                          self.port, backlog=1024))
                poll = loop.create_task(self._poll())
            except OSError as e:
                failed.append(e)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                poll.cancel()
                for replica in self.replicas.values():
                    replica.close()
                loop.run_until_complete(asyncio.sleep(0))
                loop.close()

        self._thread = threading.Thread(target=run, name="seqexport-front", daemon=True)
        self._thread.start()
        started.wait()
        if failed:
            raise failed[0]
        return self

    def close(self) -> None:
        """Stop: no new connections; the requests in progress may take the limits' shutdown grace,
        then each ends with 503 "shutting down; retry" (a stream: an error event and [DONE]).
        Before, the loop just stopped: every answer in progress was cut mid-body."""
        if self._loop is not None and self._loop.is_running():
            import concurrent.futures

            grace = self.limits.shutdown_grace_s
            try:
                asyncio.run_coroutine_threadsafe(self._drain(grace), self._loop).result(grace + ENDING_S + 1)
            except concurrent.futures.TimeoutError:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _drain(self, grace: float) -> None:
        self.stopping = True
        self._server.close()
        for client in list(self.clients):
            if client.task is None and not client.ready:  # between requests: nothing to lose
                client.transport.close()
        if self._serving:
            await asyncio.wait(set(self._serving), timeout=grace)
        for client in list(self.clients):  # past the grace: each relay ends (`_answer`)
            if client.upstream is not None:
                client.upstream.close()
        if self._serving:
            await asyncio.wait(set(self._serving), timeout=ENDING_S)

    async def _poll(self) -> None:
        while True:
            self._refresh()
            await asyncio.sleep(POLL_S)

    def _refresh(self) -> None:
        try:
            live = self.registry.read()
        except OSError:
            return
        for pid in [p for p in self.replicas if p not in live or self.replicas[p].address != live[p]]:
            self.replicas.pop(pid).close()
        for pid, address in live.items():
            if pid not in self.replicas:
                self.replicas[pid] = _Replica(pid, address)

    def _pick(self) -> _Replica | None:
        """The replica with the fewest requests in flight, ties taken in turn."""
        replicas = list(self.replicas.values())
        if not replicas:
            return None
        self._turn += 1
        k = self._turn % len(replicas)
        turned = replicas[k:] + replicas[:k]
        return min(turned, key=lambda r: r.inflight)

    async def _answer(self, client: _Client, request: _Asked) -> bool:
        """One request to a replica, again to another if one went away before answering; whether
        the client's connection can take another request."""
        for attempt in range(self.retries + 1):
            if self.stopping:
                return await self._refuse_stopping(client, request)
            replica = self._pick() or (self._refresh() or self._pick())
            if replica is not None:
                reply = _Relay(client, request.method == b"HEAD", request.version == "1.1")
                if await self._attempt(client, replica, request, reply):
                    await client.drain()
                    return not reply.close and not client.gone and not self.stopping
                if client.gone:
                    return False
                if reply.sent:
                    keep = reply.end_cut(shutting_down() if self.stopping else None)
                    await client.drain()
                    return keep and not self.stopping
                if self.stopping:
                    return await self._refuse_stopping(client, request)
                if self._again_at_once(replica, reply):
                    continue
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * 2**attempt)
                self._refresh()
        busy = HTTPError(503, "no replica answered this request (one went away); retry", kind="server_busy",
                         headers={"Retry-After": "1"})
        client.write(raw_response(busy, headers=self.cors(request)))
        await client.drain()
        return True

    async def _refuse_stopping(self, client: _Client, request: _Asked) -> bool:
        client.write(raw_response(shutting_down(), close=True, headers=self.cors(request)))
        await client.drain()
        return False

    def cors(self, request: _Asked) -> dict:
        """For an answer the front writes itself (a 413, a 503): the CORS header the replicas'
        app would have sent this request's Origin (`--allow-origin`), so a page there can read it."""
        if not self.allow_origins:
            return {}
        origin = next((v for n, v in request.headers if n.lower() == b"origin"), b"").decode("latin-1")
        if "*" in self.allow_origins:
            return {"Access-Control-Allow-Origin": "*"}
        if origin in self.allow_origins:
            return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        return {}

    def _again_at_once(self, replica: _Replica, reply: _Relay) -> bool:
        """After an attempt that relayed nothing: whether to try again without waiting (a keep-alive
        connection the replica had closed; a dead replica, dropped, while another is live)."""
        if _alive(replica.pid):
            return reply.reused
        self.replicas.pop(replica.pid, None)
        replica.close()
        return bool(self.replicas)

    async def _attempt(self, client: _Client, replica: _Replica, request: _Asked, reply: _Relay) -> bool:
        """Whether the replica answered whole; the connection goes back to its pool if so."""
        try:
            reader, writer, reply.reused = await replica.connection()
        except OSError:
            return False
        if client.gone:
            writer.close()
            return False
        replica.inflight += 1
        client.upstream = writer  # the client gone: so is the replica's connection
        whole = False
        try:
            writer.write(request.upstream())
            while not reply.complete:
                data = await reader.read(65536)
                if not data:
                    return False
                reply.parser.feed_data(data)
                reply.relay()
                await client.drain()
            whole = True
            return True
        except Exception as e:  # the replica's connection reset, or its bytes not HTTP
            log.debug("front: replica %d: %r", replica.pid, e)
            return False
        finally:
            replica.inflight -= 1
            client.upstream = None
            if whole and not reply.head_only and not writer.is_closing():
                replica.idle.append((reader, writer))
            else:
                writer.close()
