"""uvicorn's httptools protocol with a limit on a request's head (request line and headers).

uvicorn holds a request's headers until its head ends, and httptools each header until its
line ends, with no limit: a 300 MB header line raised a `serve --no-ray` process's memory by
354 MB. Here the bytes read while a head is unfinished are counted (`protocol.HeadBytes`, as the
embedded default's front counts them); past HEAD_LIMIT the answer is 431 as JSON, naming the
limit, and the connection closes."""

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from seqexport.serve.protocol import HeadBytes, head_too_large, raw_response


class HeadLimited(HttpToolsProtocol):
    """`uvicorn.Config(app, http=HeadLimited)`."""

    _head: HeadBytes | None = None
    _refused = False

    def connection_made(self, transport) -> None:
        self._head = HeadBytes()
        super().connection_made(transport)

    def on_headers_complete(self) -> None:
        self._head.head_ended()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._head.message_ended()
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        ends = self._head.ends
        super().data_received(data)
        if not self.transport.is_closing() and self._head.over(ends, len(data)):
            self._refused = True
            self.transport.write(raw_response(head_too_large(), close=True))
            self.transport.close()
