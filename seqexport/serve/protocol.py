"""The OpenAI completions and chat completions requests, checked field by field, and the JSON
the server answers.

    params = parse_completion(body_bytes)      # HTTPError 400 naming the field, or params
    params = parse_chat(body_bytes)            # the same with `messages` (rendered by the model's chat template)
    completion_body(...) / chunk_body(...)     # the response and the stream's chunks (chat_body, chat_chunk_body)

Follows the OpenAI `/v1/completions` API (as vLLM and TGI do) so its clients work unchanged;
fields we do not implement are accepted only at their neutral value (e.g. n = 1), others are
refused with the field named. Extensions, as in vLLM: `top_k`, `min_p`, `min_tokens`, `repetition_penalty`, `ignore_eos`,
`bad_words`; each choice
also carries `token_ids` (what generate() would return).
"""

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from seqexport.errors import InputError, shown
from seqexport.runtime.chat import check_messages, check_variables


class HTTPError(Exception):
    """An error answer: status, message, the request field at fault (OpenAI's `param`)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class CompletionParams:
    prompt: str | list[int] | None  # None for a chat request
    model: str | None = None
    # None where the request leaves a field out: the model's generation default, else OpenAI's
    # (ServingHost.options: max_tokens 16 for a completion, to eos for a chat; temperature 1)
    max_tokens: int | None = None
    temperature: float | None = None  # 0: greedy
    top_p: float | None = None
    top_k: int | None = None  # 0 (or -1, vLLM's spelling): off
    min_p: float | None = None  # vLLM extension: 0 off
    min_tokens: int | None = None  # vLLM extension: no eos before this many tokens
    repetition_penalty: float | None = None  # vLLM extension (transformers'): 1 off
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # OpenAI's: token id -> bias in [-100, 100]
    bad_words: list[str] = field(default_factory=list)  # vLLM extension: words that never come out
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the counts
    ignore_eos: bool = False  # vLLM extension: generate max_tokens tokens whatever comes
    messages: list[dict] | None = None  # a chat request's conversation (/v1/chat/completions)
    chat_template_kwargs: dict | None = None  # vLLM extension: more variables for the chat template


# fields of the OpenAI API we accept only at the value that changes nothing
NEUTRAL = {"n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (None, 0), "suffix": (None, "")}
# the same for a chat request (no tools: the model answers in text)
CHAT_NEUTRAL = {"n": (1,), "logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none"),
                "response_format": (None, {"type": "text"}), "parallel_tool_calls": (None, True, False)}
IGNORED = {"user"}  # accepted and not used
# A chat answer with no max_tokens runs to its eos, up to the model's positional limit, else this
# many tokens: OpenAI's chat API has no fixed default, and the completions' 16 cuts answers short
CHAT_MAX_TOKENS = 4096
SAMPLING = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
            "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
            "logit_bias", "bad_words"}
MAX_STOPS = 4  # as OpenAI
# characters of one stop string: each is indexed when its request arrives, on the event loop
# (serve.text.StopMatcher: ~0.6 us a character, so a 1 MB stop string held every client 0.6 s)
MAX_STOP_CHARS = 4096
MAX_BAD_WORDS = 256  # words of one request's bad_words (each tokenized as the request arrives), of MAX_STOP_CHARS at most


# A request body may hold this much a prompt token (a list of int64 ids: up to 21 bytes each; text
# with JSON's \\u escapes: 6-12 bytes a character, a few characters a token), and never less than
# 1 MiB in all. Past it the body is refused (413) as it arrives, before it is read into memory: a
# 500 MB body was buffered whole (the server's memory rose by as much) before JSON refused it.
BODY_BYTES_PER_TOKEN = 64
MIN_BODY_LIMIT = 1 << 20
HEAD_LIMIT = 64 << 10  # request line and headers: past it, 431


def body_limit(max_prompt_tokens: int) -> int:
    """The largest request body a server taking prompts of up to `max_prompt_tokens` accepts."""
    return max(MIN_BODY_LIMIT, BODY_BYTES_PER_TOKEN * max_prompt_tokens)


def body_too_large(limit: int, length: int | None = None) -> HTTPError:
    """413 (the server reads the rest of the body and drops it: a client that sends it all
    before reading still gets this answer; the connection stays open)."""
    size = f"{length} bytes, over" if length is not None else "over"
    return HTTPError(413, f"request body: {size} this server's limit of {limit} bytes ({BODY_BYTES_PER_TOKEN} "
                          "bytes a prompt token, at least 1 MiB; --max-prompt-tokens raises it)")


def head_too_large() -> HTTPError:
    return HTTPError(431, f"request line and headers: over {HEAD_LIMIT} bytes")


def malformed(why: Exception | str) -> HTTPError:
    """400 for bytes that are not an HTTP request, naming the parser's reason (httptools': e.g.
    "Invalid character in Content-Length"); the connection then closes (the parser cannot go on)."""
    return HTTPError(400, f"malformed HTTP request: {why}")


def shutting_down() -> HTTPError:
    """503 for a request the server ends because it is stopping (SIGTERM or Ctrl-C, past the
    shutdown grace): another server, or this one restarted, can answer it."""
    return HTTPError(503, "the server is shutting down; retry", kind="server_busy", headers={"Retry-After": "1"})


class HeadBytes:
    """Bytes read while a request's head is unfinished, for a parser (httptools) that holds a
    header until its line ends, so no callback sees a head grow. A read that ended a head or a
    request is not counted (where the new head began in it is unknown): the limit is HEAD_LIMIT
    and at most one read. The parser's owner calls `head_ended` / `message_ended` from its
    callbacks and `over(ends, n)` after feeding a read of `n` bytes (`ends`: `.ends` before)."""

    def __init__(self):
        self.in_head, self.count, self.ends = True, 0, 0

    def head_ended(self) -> None:
        self.in_head, self.ends = False, self.ends + 1

    def message_ended(self) -> None:
        self.in_head, self.count, self.ends = True, 0, self.ends + 1  # the next request's head, if any

    def over(self, ends: int, n: int) -> bool:
        if not self.in_head:
            return False
        self.count = self.count + n if ends == self.ends else 0
        return self.count > HEAD_LIMIT


def raw_response(error: HTTPError, close: bool = False, headers: dict | None = None) -> bytes:
    """`error` as a whole HTTP/1.1 response with its JSON body, for code below the ASGI app (the
    front, uvicorn's protocol) that answers a request itself; `headers`: more (e.g. CORS)."""
    body = json.dumps(error.body()).encode()
    head = [f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}", "content-type: application/json",
            *(f"{k.lower()}: {v}" for k, v in {**error.headers, **(headers or {})}.items()),
            f"content-length: {len(body)}"]
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _bad(param: str, message: str) -> HTTPError:
    return HTTPError(400, f"{param}: {message}", param)


def _integer(body: dict, name: str, least: int, default, allow_none=False):
    v = body.get(name, default)
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, f"expected an integer >= {least}, got {json.dumps(v)}")
    if v < least or v >= 2**63:
        raise _bad(name, f"expected an integer >= {least}" + (" below 2**63" if v >= 2**63 else "") + f", got {v}")
    return v


def _number(body: dict, name: str, default: float | None, rule: str, ok) -> float | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _bad(name, f"expected a number {rule}, got {json.dumps(v)}")
    if not math.isfinite(v) or not ok(v):
        raise _bad(name, f"expected a number {rule}, got {v}")
    return float(v)


def _logit_bias(v) -> dict[int, float]:
    """OpenAI's logit_bias: an object of token ids (as strings, JSON's keys) to numbers in
    [-100, 100]; null or {} for none. Whether each id is the model's: the host's check."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _bad("logit_bias", f"expected an object of token ids to numbers in [-100, 100], got {json.dumps(v)}")
    bias = {}
    for key, value in v.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 18:
            raise _bad("logit_bias", f"key {json.dumps(key)}: expected a token id (a whole number >= 0, as a string)")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise _bad("logit_bias", f"token {key}: expected a number in [-100, 100], got {json.dumps(value)}")
        bias[int(key)] = float(value)
    return bias


def _flag(body: dict, name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(name, f"expected true or false, got {json.dumps(v)}")
    return v


def _prompt(v) -> str | list[int]:
    """A string or a list of token ids; a batch of one ([str] or [[ids]]) is unwrapped."""
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str | list):
        v = v[0]
    if isinstance(v, str):
        if not v:
            raise _bad("prompt", "empty string; expected text or a list of token ids")
        return v
    if isinstance(v, list):
        if not v:
            raise _bad("prompt", "empty list; expected text or a list of token ids")
        for i, x in enumerate(v):
            if isinstance(x, str | list):
                raise _bad("prompt", "several prompts in one request; send one request per prompt")
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**63:
                raise _bad("prompt", f"element {i}: expected a token id (integer >= 0), got {json.dumps(x)}")
        return v
    raise _bad("prompt", f"expected a string or a list of token ids, got {json.dumps(v)}")


def _stop(v) -> list[str]:
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", f"expected a string or a list of strings, got {json.dumps(v)}")
    if len(stops) > MAX_STOPS:
        raise _bad("stop", f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    if any(not s for s in stops):
        raise _bad("stop", "empty stop string")
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            raise _bad("stop", f"element {i}: {len(s)} characters; a stop string has at most {MAX_STOP_CHARS}")
    return stops


def _same(a, b) -> bool:
    """JSON equality without Python's True == 1."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(b, int | float):
        return isinstance(a, int | float) and a == b
    return a == b


def _check_fields(body: dict, known: set[str], neutral: dict) -> None:
    """400 for a field we do not know, or one we take only at its neutral value."""
    known = known | neutral.keys() | IGNORED
    for name in body:
        if name not in known:
            raise _bad(name, f"unknown field; expected one of {sorted(known)}")
    for name, values in neutral.items():
        if name in body and not any(_same(body[name], v) for v in values):
            raise _bad(name, f"not supported here except {' or '.join(json.dumps(v) for v in values)}; "
                             f"got {json.dumps(body[name])}")


def _json_object(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HTTPError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, f"request body: expected a JSON object, got {type(body).__name__}")
    return body


def parse_completion(raw: bytes) -> CompletionParams:
    """The request body -> CompletionParams; HTTPError 400 naming the first bad field."""
    body = _json_object(raw)
    _check_fields(body, SAMPLING | {"prompt"}, NEUTRAL)
    if "prompt" not in body:
        raise _bad("prompt", "missing; expected text or a list of token ids")
    return _sampling(body, prompt=_prompt(body["prompt"]))


def parse_chat(raw: bytes) -> CompletionParams:
    """A /v1/chat/completions body -> CompletionParams with `messages` (their roles and contents
    are checked where the model's chat template renders them); 400 naming the first bad field.
    `max_completion_tokens` is the newer name of `max_tokens`."""
    body = _json_object(raw)
    _check_fields(body, SAMPLING | {"messages", "max_completion_tokens", "chat_template_kwargs"}, CHAT_NEUTRAL)
    if "messages" not in body:
        raise _bad("messages", "missing; expected a list of {role, content} objects")
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None:
            raise _bad("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
        body = {**body, "max_tokens": _integer(body, "max_completion_tokens", 1, 16)}
    # the conversation's shape, by the runtime's own checks (what the template makes of it: later)
    messages = _checked(check_messages, body["messages"], "messages")
    variables = _checked(check_variables, body.get("chat_template_kwargs"), "chat_template_kwargs")
    # no max_tokens: the model's generation default, else its limit, else CHAT_MAX_TOKENS (ServingHost.options)
    return _sampling(body, prompt=None, messages=messages, chat_template_kwargs=variables)


def _checked(check, value, param: str):
    try:
        return check(value)
    except InputError as e:
        raise HTTPError(400, str(e), param) from None


def _sampling(body: dict, **request) -> CompletionParams:
    """The fields a completion and a chat request share (None: left out, or null)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"expected a string, got {json.dumps(model)}")
    top_k = body.get("top_k")
    top_k = 0 if top_k == -1 and not isinstance(top_k, bool) else _integer(body, "top_k", 0, None, allow_none=True)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise _bad("stream_options", f"expected {{\"include_usage\": true|false}}, got {json.dumps(options)}")
    params = CompletionParams(
        **request,
        model=model,
        max_tokens=_integer(body, "max_tokens", 1, None, allow_none=True),
        temperature=_number(body, "temperature", None, ">= 0", lambda v: v >= 0),
        top_p=_number(body, "top_p", None, "in (0, 1]", lambda v: 0 < v <= 1),
        top_k=top_k,
        min_p=_number(body, "min_p", None, "in [0, 1]", lambda v: 0 <= v <= 1),
        min_tokens=_integer(body, "min_tokens", 0, None, allow_none=True),
        repetition_penalty=_number(body, "repetition_penalty", None, "> 0", lambda v: v > 0),
        presence_penalty=_number(body, "presence_penalty", 0.0, "in [-2, 2]", lambda v: -2 <= v <= 2),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, "in [-2, 2]", lambda v: -2 <= v <= 2),
        logit_bias=_logit_bias(body.get("logit_bias")),
        bad_words=_bad_words(body.get("bad_words")),
        seed=_integer(body, "seed", 0, None, allow_none=True),
        stop=_stop(body.get("stop")),
        stream=_flag(body, "stream"),
        include_usage=_flag(options or {}, "include_usage"),
        ignore_eos=_flag(body, "ignore_eos"),
    )
    if params.include_usage and not params.stream:
        raise _bad("stream_options", "only with stream: true")
    return params


def _bad_words(value) -> list[str]:
    """vLLM's bad_words: a list of words (strings with a character other than a space)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad("bad_words", f"expected a list of words, got {shown(value)}")
    if len(value) > MAX_BAD_WORDS:
        raise _bad("bad_words", f"at most {MAX_BAD_WORDS} words, got {len(value)}")
    for i, word in enumerate(value):
        if not isinstance(word, str) or not word.strip() or len(word) > MAX_STOP_CHARS:
            raise _bad("bad_words", f"element {i}: expected a word (a string with a character other than a space, "
                                    f"of at most {MAX_STOP_CHARS} characters), got {shown(word)}")
    return value


def completion_body(rid: str, model: str, text: str, token_ids: list[int], finish_reason: str,
                    prompt_tokens: int, created: int | None = None) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": created or int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                     "token_ids": token_ids}],
        "usage": usage(prompt_tokens, len(token_ids)),
    }


def chunk_body(rid: str, model: str, created: int, text: str, token_ids: list[int],
               finish_reason: str | None = None) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                     "token_ids": token_ids}],
    }


def chat_body(rid: str, model: str, text: str, token_ids: list[int], finish_reason: str,
              prompt_tokens: int, created: int | None = None) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": created or int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                     "finish_reason": finish_reason, "token_ids": token_ids}],
        "usage": usage(prompt_tokens, len(token_ids)),
    }


def chat_chunk_body(rid: str, model: str, created: int, text: str, token_ids: list[int],
                    finish_reason: str | None = None, role: bool = False) -> dict:
    """A chat stream's chunk: the first says the role, the last (empty delta) why it ended."""
    delta = {"role": "assistant", "content": text} if role else {"content": text} if finish_reason is None else {}
    return {
        "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason,
                     "token_ids": token_ids}],
    }


@dataclass(frozen=True)
class Shape:
    """How one endpoint answers: the id's prefix, the whole body, a stream's chunks."""

    prefix: str
    body: Callable[..., dict]  # (rid, model, text, token_ids, finish_reason, prompt_tokens)
    chunk: Callable[..., dict]  # (rid, model, created, text, token_ids, finish_reason=None)
    chunk_object: str
    chat: bool


COMPLETION = Shape("cmpl-", completion_body, chunk_body, "text_completion", chat=False)
CHAT = Shape("chatcmpl-", chat_body, chat_chunk_body, "chat.completion.chunk", chat=True)


class ChunkEvents:
    """A stream's token events as `sse(shape.chunk(...))` writes them, the same bytes, from a
    template made once a stream (a token's event: its text and id put in, not a dict dumped)."""

    def __init__(self, rid: str, model: str, created: int, shape: Shape = COMPLETION):
        self.rid, self.created = rid, created
        head, tail = sse(shape.chunk(rid, model, created, "\0", [0])).decode().split(json.dumps("\0"))
        self._head, self._tail = head, tail.replace("[0]", "[%d]", 1)

    def token(self, text: str, token: int) -> bytes:
        return (self._head + json.dumps(text) + self._tail % token).encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(payload: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()
