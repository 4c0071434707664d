"""The HTTP server over one engine: OpenAI-style completions (SSE when streaming), models,
health, Prometheus metrics. The same app runs under plain uvicorn or as a Ray Serve replica.

    host = ServingHost(ServeConfig("exported/mamba-dates"))   # loads the model, starts the engine
    app = build_app(host)                                     # a FastAPI app

Every answer to bad input is a 4xx JSON body naming the field (`error.param`); a full queue
is 503 with Retry-After; a request past its timeout is 504; a client that goes away frees
its row at the next step boundary.
"""

import asyncio
import json
import os
import random
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from seqexport.errors import InputError, SeqexportError, UsageError
from seqexport.runtime.engine import Engine, QueueFull
from seqexport.runtime.generate import CUTOFFS, SearchOptions, check_token_ids
from seqexport.runtime.models import load
from seqexport.runtime.penalties import RULES
from seqexport.serve.bad_words import bad_words_ids
from seqexport.serve.metrics import CONTENT_TYPE, ServerMetrics
from seqexport.serve.protocol import (
    CHAT,
    CHAT_MAX_TOKENS,
    COMPLETION,
    ChunkEvents,
    CompletionParams,
    HTTPError,
    Shape,
    body_limit,
    body_too_large,
    parse_chat,
    parse_completion,
    shutting_down,
    sse,
    usage,
)
from seqexport.serve.text import TextOutput


@dataclass(frozen=True)
class ServeConfig:
    """What one server (or one Ray Serve replica) runs; plain values, so Ray can ship it."""

    folder: str
    model_name: str | None = None  # the `model` clients name [the folder's name]
    provider: str = "auto"  # ONNX Runtime execution provider: auto, cpu, cuda
    threads: int | None = 1  # ORT intra-op threads (None: ORT's default, a spinning pool on every core)
    max_rows: int = 16  # rows of the running batch
    max_queue: int = 256  # waiting requests beyond which the server answers 503
    max_prompt_tokens: int = 2048  # longer prompts are refused (400)
    max_state_bytes: int | None = None  # cap on the running batch's cache/state memory
    prefill_chunk: int = 64  # prompt tokens a joining request feeds through the batch's steps (Engine)
    start_batch: int = 4  # waiting requests the starter prefills in one run (Engine; ragged prefill)
    request_timeout: float = 300.0  # seconds from submit to the last token (504 after)
    pin_threads: bool = False  # the engine thread on one CPU, the starter on the others (Engine)
    allow_origins: list[str] | None = None  # web pages (scheme://host[:port], or "*") that may call it (CORS)
    generation_config: str = "model"  # "model": its generation defaults fill what a request leaves out; "none"

    def to_dict(self) -> dict:
        return asdict(self)


COMPLETION_MAX_TOKENS = 16  # OpenAI's default max_tokens for a completion
# what a request takes from the model's generation defaults (as vLLM): do_sample and beams are
# transformers' generate's; OpenAI's API says greedy by temperature 0 and has no beam search
SERVED_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens", "min_new_tokens", "repetition_penalty",
                   *CUTOFFS,  # (transformers' typical, epsilon and eta sampling: no request field sets them)
                   *RULES)  # (the token rules: no request field sets them; transformers' generate applies them)


def served_defaults(defaults: dict, source: str) -> dict:
    """The model's generation defaults a request takes (none with `--generation-config none`)."""
    return {k: defaults[k] for k in SERVED_DEFAULTS if k in defaults} if source == "model" else {}


def _first(*values):
    """The first value that is not None (None if all are)."""
    return next((v for v in values if v is not None), None)


class ServingHost:
    """One model and its engine (running on a background thread), plus the server's metrics."""

    def __init__(self, config: ServeConfig, manifest: dict | None = None):
        """`manifest`: the folder's, read and hash-checked by the caller in this process (not hashed again)."""
        self.config = config
        self.outbox = Outbox()  # the engine's events, handed to the event loop once a round
        self.model = load(config.folder, provider=config.provider, threads=config.threads, manifest=manifest)
        self.engine = Engine(self.model, max_rows=config.max_rows, max_queue=config.max_queue,
                             max_state_bytes=config.max_state_bytes,
                             max_prompt_tokens=config.max_prompt_tokens, prefill_chunk=config.prefill_chunk,
                             start_batch=config.start_batch, on_round=self.outbox.flush,
                             pin_threads=config.pin_threads).start()
        self.metrics = ServerMetrics(self.engine)
        self.name = config.model_name or Path(config.folder).resolve().name
        self.body_limit = body_limit(config.max_prompt_tokens)
        self.created = int(time.time())
        self.defaults = served_defaults(self.model.generation_defaults, config.generation_config)

    def close(self) -> None:
        self.engine.close()

    def prompt_ids(self, params: CompletionParams) -> list[int]:
        if params.messages is not None:
            return self.chat_ids(params.messages, params.chat_template_kwargs)  # (both checked by parse_chat)
        if isinstance(params.prompt, list):
            return params.prompt
        if self.model.tokenizer is None:
            raise HTTPError(400, "prompt: this model has no tokenizer; send the prompt as a list of token ids",
                            "prompt")
        return self.model.encode(params.prompt)

    def chat_ids(self, messages, variables: dict | None = None) -> list[int]:
        if self.model.chat_template is None:
            raise HTTPError(400, "messages: this model has no chat template (its checkpoint had none, or it was "
                                 "exported before seqexport kept them); POST a prompt to /v1/completions", "messages")
        try:
            return self.model.encode_chat(messages, variables)
        except InputError as e:  # what the template refused
            raise HTTPError(400, str(e), "messages") from None

    def options(self, params: CompletionParams) -> SearchOptions:
        """The request's decode: each field it leaves out takes the model's generation default
        (`--generation-config model`), else OpenAI's."""
        limit = self.model.max_new_tokens_limit
        default = self.defaults
        max_tokens = params.max_tokens
        if max_tokens is None:  # a default, within what the model holds: the model's, else OpenAI's for a
            # completion, else (a chat's answer) to its eos
            max_tokens = _first(default.get("max_new_tokens"),
                                COMPLETION_MAX_TOKENS if params.messages is None else CHAT_MAX_TOKENS)
            max_tokens = min(max_tokens, limit) if limit is not None else max_tokens
        if limit is not None and max_tokens > limit:
            raise HTTPError(400, f"max_tokens: {max_tokens} exceeds what the model can hold "
                                 f"({limit} positions)", "max_tokens")
        min_tokens = _first(params.min_tokens, default.get("min_new_tokens"), 0)
        if min_tokens > max_tokens and params.min_tokens is not None:
            raise HTTPError(400, f"min_tokens: {min_tokens} is more than max_tokens {max_tokens}", "min_tokens")
        temperature = _first(params.temperature, default.get("temperature"), 1.0)
        sample = temperature != 0  # OpenAI's API: temperature 0 is greedy
        try:
            options = SearchOptions(max_new_tokens=max_tokens, do_sample=sample,
                                    temperature=temperature if sample else 1.0,
                                    top_k=_first(params.top_k, default.get("top_k"), 0),
                                    top_p=_first(params.top_p, default.get("top_p"), 1.0),
                                    min_p=_first(params.min_p, default.get("min_p"), 0.0), seed=params.seed,
                                    **{k: default[k] for k in CUTOFFS if k in default},
                                    repetition_penalty=_first(params.repetition_penalty,
                                                              default.get("repetition_penalty"), 1.0),
                                    presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
                                    min_new_tokens=min_tokens, logit_bias=params.logit_bias,
                                    eos_id=-1 if params.ignore_eos else None,
                                    **self.rules(params))
        except UsageError as e:
            raise HTTPError(400, str(e)) from None
        try:  # here, not in the engine, whose refusal would be a UsageError (a 500)
            check_token_ids(options, self.model.vocab_size)
        except UsageError as e:
            field = "logit_bias" if "logit_bias" in str(e) else "bad_words" if "bad_words" in str(e) else None
            raise HTTPError(400, str(e), field) from None
        return options

    def rules(self, params: CompletionParams) -> dict:
        """The model's token rules (SearchOptions' fields), the request's bad_words banned beside its
        bad_words_ids."""
        rules = {k: self.defaults[k] for k in RULES if k in self.defaults}
        if not params.bad_words:
            return rules
        if self.model.tokenizer is None:
            raise HTTPError(400, "bad_words: this model has no tokenizer; its rules take token ids "
                                 "(the checkpoint's generation_config bad_words_ids)", "bad_words")
        try:
            words = bad_words_ids(self.model.tokenizer, params.bad_words)
        except ValueError as e:
            raise HTTPError(400, f"bad_words: {e}", "bad_words") from None
        return rules | {"bad_words_ids": [*rules.get("bad_words_ids", ()), *words]}

    def submit(self, params: CompletionParams, listener: "Listener"):
        ids = self.prompt_ids(params)
        options = self.options(params)
        try:
            return self.engine.submit(ids, options, on_event=listener.on_event, stop=listener.stop,
                                      timeout=self.config.request_timeout), ids
        except QueueFull as e:
            self.metrics.rejected.labels("503").inc()
            raise HTTPError(503, f"server busy: {e}", kind="server_busy", headers={"Retry-After": "1"}) from None
        except InputError as e:
            field, what = ("messages", " (the conversation through the chat template)") if params.messages is not None \
                else ("prompt", "")
            raise HTTPError(400, f"{field}: {str(e).removeprefix('prompt: ')}{what}", field) from None
        except UsageError:
            if self.engine.closed:  # a request that came as the server stopped (a pipelined one)
                raise shutting_down() from None
            raise


class Outbox:
    """Engine events bound for the event loop, handed over once a round (`Engine(on_round=)`):
    one wake-up of the loop for every row's token, where a wake-up per token cost the engine
    thread ~45 us a token (the loop thread, woken 16 times a round, took the GIL back each
    time): at 16 streams 0.7 ms of a ~1 ms round. A request's events keep their order."""

    def __init__(self):
        self._items: list = []
        self._lock = threading.Lock()

    def put(self, listener: "Listener", req, item) -> None:
        with self._lock:
            self._items.append((listener, req, item))

    def flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        by_loop: dict = {}
        for listener, req, item in items:
            by_loop.setdefault(listener.loop, []).append((listener.queue, req, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the loop is closed (the server is going): free the rows
                for _, req, _ in batch:
                    req.cancel()


def _deliver(batch) -> None:
    for queue, _, item in batch:
        queue.put_nowait(item)


# A stream's tokens generated but not yet written out (the client reads slower than the model
# writes: every stage's buffers are full) past which its row is held (`Request.hold`: parked,
# no steps), and the count at which it resumes. Before, a client reading 20 KB/s of a long
# stream had ~2,400 tokens a second pile up unread in the server's memory (mamba-dates: 71,000
# tokens, 14 MB in 30 s) until the request's timeout; now at most HOLD_AT (~40 KB of events).
HOLD_AT = 256
RESUME_AT = 64


class Listener:
    """One request's engine events as an asyncio queue: (token, text piece), then (None, rest).
    `on_event` and `stop` run on the engine thread; the events reach the queue through the
    host's outbox at the end of the round (an end at once: it may come from `close()`).
    A streamed request whose client falls HOLD_AT tokens behind is held until it catches up
    (`written`, counted by the stream as its writes complete)."""

    def __init__(self, host: ServingHost, stops: list[str], loop: asyncio.AbstractEventLoop, stream: bool = False):
        self.host, self.loop = host, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.text = TextOutput(host.model.tokenizer, stops)
        self.hold_at = HOLD_AT if stream else None  # (a whole body is held in memory whatever the client)
        self.written = 0  # tokens whose events have been written out (the event loop's thread writes it)

    def on_event(self, req, token: int | None) -> None:
        if token is None:
            self.host.metrics.on_end(req)
            self.host.outbox.put(self, req, (None, self.text.flush()))
            self.host.outbox.flush()
        else:
            self.host.metrics.on_token(req)
            self.host.outbox.put(self, req, (token, self.text.push(token)))
            if self.hold_at is not None and len(req.tokens) - self.written >= self.hold_at:
                req.hold()  # the client is far behind: no more steps until it catches up

    def wrote(self, req, tokens: int) -> None:
        """`tokens` more tokens' events written out (the event loop's thread): a held request
        resumes once its client is RESUME_AT tokens or fewer behind."""
        self.written += tokens
        if req.held and len(req.tokens) - self.written <= RESUME_AT:
            req.resume()

    def stop(self, tokens) -> bool:
        return self.text.stopped


def end_error(req) -> HTTPError | None:
    """The HTTP error for a request that ended without finishing its text, else None."""
    if req.finish_reason == "error":
        if isinstance(req.error, SeqexportError):  # the model refused this prompt
            return HTTPError(400, f"prompt: {req.error}", "prompt")
        return HTTPError(500, f"the model failed on this request: {req.error}", kind="server_error")
    if req.finish_reason == "timeout":
        return HTTPError(504, f"request timed out after {req.deadline - req.submitted:g} s "
                              f"({len(req.tokens)} tokens generated); retry, or ask for fewer max_tokens",
                         kind="timeout")
    if req.finish_reason == "cancelled":
        return shutting_down()  # (the engine closed: the server is stopping)
    return None


ROUTES = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics"


def route_error(method: str, path: str, e: StarletteHTTPException) -> HTTPError:
    """Starlette's 404 / 405 (or another routing error) as an HTTPError naming the routes."""
    if e.status_code == 404:
        return HTTPError(404, f"{method} {path}: no such route; this server answers {ROUTES}", kind="not_found_error")
    if e.status_code == 405:
        return HTTPError(405, f"{method} {path}: method not allowed; this server answers {ROUTES}",
                         headers=dict(e.headers or {}))
    return HTTPError(e.status_code, f"{method} {path}: {e.detail}", headers=dict(e.headers or {}))


def build_app(host: ServingHost) -> FastAPI:
    app = FastAPI(title="seqexport", docs_url=None, redoc_url=None)
    if host.config.allow_origins:
        # a page on another origin may call the API (its preflight answered, every answer, an
        # error's too, readable by it); without them a browser lets only same-origin pages read it
        app.add_middleware(CORSMiddleware, allow_origins=list(host.config.allow_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=["retry-after", "x-replica-pid"], max_age=600)

    @app.exception_handler(HTTPError)
    async def http_error(request: Request, e: HTTPError):
        if e.status < 500:
            host.metrics.rejected.labels(str(e.status)).inc()
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, e: StarletteHTTPException):
        # a path or method with no route: the OpenAI-style error every other answer has (an
        # OpenAI client showed FastAPI's {"detail": "Not Found"}), naming what is served
        return await http_error(request, route_error(request.method, request.url.path, e))

    @app.get("/health")
    async def health():
        e = host.engine
        return {"status": "ok", "model": host.name, "family": host.model.family, "pid": os.getpid(),
                "active_rows": e.active_rows, "queue_length": e.queue_length}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": host.name, "object": "model", "created": host.created,
                                            "owned_by": "seqexport"}]}

    @app.get("/metrics")
    async def metrics():
        return Response(host.metrics.exposition(), media_type=CONTENT_TYPE)

    app.router.add_route("/v1/completions", Completions(host, COMPLETION), methods=["POST"])
    app.router.add_route("/v1/chat/completions", Completions(host, CHAT), methods=["POST"])
    return app


class Completions:
    """POST /v1/completions as a plain ASGI app (routed by build_app's FastAPI app, its errors
    answered by its handler): the request through the engine, its tokens as one JSON body or
    an SSE stream. Plain ASGI where FastAPI's Request, endpoint wrapping and StreamingResponse
    (an anyio task group a request, one body message an event, an empty last one) cost the
    replica more CPU a request than the tokens; a client's hang-up is seen from `receive` at
    once (no poll); and the events ready at once go out as one message: the last token's with
    the finish chunk, [DONE] and the body's end, one write where there were four."""

    def __init__(self, host: ServingHost, shape: Shape):
        self.host, self.shape = host, shape  # POST /v1/completions, or /v1/chat/completions (CHAT)
        self.parse = parse_chat if shape.chat else parse_completion

    async def __call__(self, scope, receive, send) -> None:
        host, shape = self.host, self.shape
        params = self.parse(await _body(scope, receive, host.body_limit))
        if params.model is not None and params.model != host.name:
            raise HTTPError(404, f"model: {params.model!r} is not served here; this server has {host.name!r}",
                            "model", kind="not_found_error")
        listener = Listener(host, params.stop, asyncio.get_running_loop(), params.stream)
        req, ids = host.submit(params, listener)
        host.metrics.prompt_tokens.inc(len(ids))
        watch = asyncio.ensure_future(_hang_up(receive, req))  # a caller that hangs up frees the row
        try:
            first = await listener.queue.get()  # the first token, or why there is none
            if first[0] is None and (err := end_error(req)) is not None:
                raise err
            rid = f"{shape.prefix}{random.getrandbits(128):032x}"  # not uuid4: os.urandom lets the GIL go, to the engine
            if params.stream:
                await _stream(host, req, listener, first, rid, len(ids), params, send, shape)
                return
            pieces, item = [first[1]], first
            while item[0] is not None:
                item = await listener.queue.get()
                pieces.append(item[1])
        finally:
            watch.cancel()
            if not req.finished:
                host.engine.cancel(req)  # the client went away (or a send failed): free the row
        if (err := end_error(req)) is not None:
            raise err
        body = shape.body(rid, host.name, "".join(pieces), list(req.tokens), req.finish_reason, len(ids))
        await _send_json(send, body)


async def _body(scope, receive, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to pass `limit`: by its
    Content-Length before any of it is read, else (chunked) once the bytes read pass it."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise body_too_large(limit, int(value))
    chunks, more, size = [], True, 0
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _hang_up(receive, req) -> None:
    """Cancel the request once its client has gone away (`receive` answers http.disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if not req.finished:
        req.cancel()


async def _send_json(send, body: dict) -> None:
    data = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()  # as JSONResponse
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


async def _stream(host, req, listener, first, rid, prompt_tokens, params, send, shape: Shape) -> None:
    """The SSE stream: each body message carries every event already in the listener's queue
    (a chat stream's first chunk says the role, as OpenAI's does)."""
    created = int(time.time())
    chunk = ChunkEvents(rid, host.name, created, shape)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
        (b"x-replica-pid", str(os.getpid()).encode())]})
    item, queue = first, listener.queue
    events = [sse(shape.chunk(rid, host.name, created, "", [], role=True))] if shape.chat else []
    lead = len(events)  # events of the first message that are no token
    while True:
        while item[0] is not None:
            events.append(chunk.token(item[1], item[0]))
            if queue.empty():
                break
            item = queue.get_nowait()
        if item[0] is None:  # the end: its events in the same message
            events += _ending(host, req, chunk, item[1], prompt_tokens, params, shape)
            await send({"type": "http.response.body", "body": b"".join(events), "more_body": False})
            return
        await send({"type": "http.response.body", "body": b"".join(events), "more_body": True})
        listener.wrote(req, len(events) - lead)  # (send returns once the transport takes more)
        item, events, lead = await queue.get(), [], 0


def _ending(host, req, chunk: "ChunkEvents", rest: str, prompt_tokens: int, params, shape: Shape) -> list[bytes]:
    err = end_error(req)
    if err is not None:
        return [sse(err.body()), sse("[DONE]")]
    events = []
    if rest and shape.chat:  # text held back until the end (a stop string's candidate): its own delta
        events.append(sse(shape.chunk(chunk.rid, host.name, chunk.created, rest, [])))
        rest = ""
    events.append(sse(shape.chunk(chunk.rid, host.name, chunk.created, rest, [], req.finish_reason)))
    if params.include_usage:
        events.append(sse({"id": chunk.rid, "object": shape.chunk_object, "created": chunk.created,
                           "model": host.name, "choices": [], "usage": usage(prompt_tokens, len(req.tokens))}))
    return events + [sse("[DONE]")]
