"""uvicorn's httptools protocol with a limit on a request's head (request line and headers).

uvicorn holds a request's headers until its head ends, and httptools each header until its
line ends, with no limit: a 300 MB header line raised a `serve --no-ray` process's memory by
354 MB. Here the bytes read while a head is unfinished are counted (a read that ended a head or
a request is not: the limit is HEAD_LIMIT and at most one read); past HEAD_LIMIT the answer is
431 as JSON, naming the limit, and the connection closes. (The embedded default's front has the
same rule: seqexport.serve.front.)"""

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from seqexport.serve.protocol import HEAD_LIMIT, HTTPError


class HeadLimited(HttpToolsProtocol):
    """`uvicorn.Config(app, http=HeadLimited)`."""

    _in_head, _head_bytes, _ends, _refused = True, 0, 0, False

    def on_headers_complete(self) -> None:
        self._in_head, self._ends = False, self._ends + 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes, self._ends = True, 0, self._ends + 1
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        ends = self._ends
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes = self._head_bytes + len(data) if ends == self._ends else 0
            if self._head_bytes > HEAD_LIMIT:
                self._refuse()

    def _refuse(self) -> None:
        self._refused = True
        error = HTTPError(431, f"request line and headers: over {HEAD_LIMIT} bytes")
        body = json.dumps(error.body()).encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()
