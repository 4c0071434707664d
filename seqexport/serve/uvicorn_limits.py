"""uvicorn's httptools protocol held to our limits on a client: a request's head (request line
and headers) no longer than HEAD_LIMIT, and, where a server has them, its `ClientLimits`
(seqexport.serve.clients: how long a request may take to arrive, or its answer to be taken,
and how many connections are held).

uvicorn holds a request's headers until its head ends, and httptools each header until its
line ends, with no limit: a 300 MB header line raised a `serve --no-ray` process's memory by
354 MB. Here the bytes read while a head is unfinished are counted (`protocol.HeadBytes`, as the
embedded default's front counts them); past HEAD_LIMIT the answer is 431 as JSON, naming the
limit, and the connection closes. uvicorn times nothing out but an idle keep-alive connection
after an answer; the rest is `ClientLimits`'."""

import sys

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from seqexport.serve.clients import ClientClock, ClientLimits
from seqexport.serve.protocol import HeadBytes, head_too_large, malformed, raw_response


def limited_protocol(limits: ClientLimits | None) -> type:
    """The protocol class for `uvicorn.Config(app, http=...)`: the head limit, and `limits`
    (None: a server whose only client is the front, which holds its clients to them)."""
    return type("LimitedHttp", (LimitedHttp,), {"limits": limits})


class LimitedHttp(HttpToolsProtocol):
    limits: ClientLimits | None = None
    _head: HeadBytes | None = None
    _clock: ClientClock | None = None
    _refused = False
    _last_answer: bytes | None = None  # a 400 or 431 for bytes past requests still being answered

    def connection_made(self, transport) -> None:
        self._head = HeadBytes()
        self._whole: set = set()  # the cycles of whole requests not yet answered
        super().connection_made(transport)
        if self.limits is not None:
            self._clock = self.limits.opened(transport)
            self._refused = self._clock is None  # too many connections: 503 written, closing

    def connection_lost(self, exc) -> None:
        if self._clock is not None:
            self._clock.lost()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._clock is not None:
            self._clock.began()

    def on_headers_complete(self) -> None:
        self._head.head_ended()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._head.message_ended()
        super().on_message_complete()
        # uvicorn runs the app from the head on; a request is waited on until it is whole,
        # unless it was answered before (a 413 by its Content-Length)
        whole = self.cycle is not None and not self.cycle.response_complete
        if whole:
            self._whole.add(self.cycle)
        if self._clock is not None:
            self._clock.ended()
            if whole:
                self._clock.answering()

    def _unanswered(self) -> bool:
        """Whether a whole request is still being answered, or waits to be."""
        self._whole = {c for c in self._whole if not c.response_complete}
        return bool(self._whole)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._unanswered():
            return
        if self._last_answer is not None:
            if not self.transport.is_closing():
                self.transport.write(self._last_answer)
                self.transport.close()
        elif self._clock is not None:
            self._clock.ready()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._clock is not None:
            self._clock.write_paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._clock is not None:
            self._clock.write_resumed()

    def send_400_response(self, msg: str) -> None:
        """Bytes that are not HTTP: 400 as JSON naming httptools' reason (uvicorn's answer is
        plain text, "Invalid HTTP request received."), then the connection closes. uvicorn
        calls this from its `except httptools.HttpParserError`: that error is the one handled."""
        self._end_with(raw_response(malformed(sys.exception() or msg), close=True))

    def _end_with(self, answer: bytes) -> None:
        """Nothing more read; `answer` once the whole requests before it are answered (uvicorn
        sent its 400 at once, and theirs were lost), then the connection closes."""
        self._refused = True
        if self._unanswered():
            self._last_answer = answer
            return
        self.transport.write(answer)
        self.transport.close()

    def _unsupported_upgrade_warning(self) -> None:
        """An upgrade request (WebSocket; none is served, `ws="none"`): answered as plain HTTP,
        then the connection closes, as the front does (past it the bytes are not HTTP). uvicorn
        warned to install a WebSocket library and kept the connection."""
        if self.cycle is not None:
            self.cycle.keep_alive = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        ends = self._head.ends
        super().data_received(data)
        if not self.transport.is_closing() and self._head.over(ends, len(data)):
            self._end_with(raw_response(head_too_large(), close=True))
