"""How `serve --no-ray` stops on SIGTERM or Ctrl-C: uvicorn, ending what it cannot finish.

uvicorn stops accepting, closes idle connections, lets the requests in progress run for
its graceful-shutdown timeout, then cancels their tasks. Before, a stream still running
then was cut mid-body: no error event, no [DONE], not even the chunked body's end, so a
client could not tell a server that stopped from a network fault. Here, once the grace
(`ClientLimits.shutdown_grace_s`) has passed, the engine is closed first: every request still
running or waiting ends "cancelled", which the app answers as 503 "the server is shutting
down; retry" (a stream: that error event, then [DONE]); uvicorn gives those answers ENDING_S
to be written before it cancels anything. The embedded default's front does the same
(`Front.close`)."""

import asyncio
from collections.abc import Callable

import uvicorn

from seqexport.serve.clients import ENDING_S


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, end_requests: Callable[[], None], grace_s: float):
        config.timeout_graceful_shutdown = grace_s + ENDING_S
        super().__init__(config)
        self.end_requests = end_requests  # ends every request in progress (blocking: run on a thread)
        self.grace_s = grace_s
        self.stopped_by: int | None = None  # the first signal that stopped it

    def handle_exit(self, sig: int, frame) -> None:
        """uvicorn's, noting the signal: `run_plain` exits by it once the server has stopped
        (uvicorn raises it again after restoring the handlers, but the CLI's Ctrl-C handler
        defers a signal that lands inside an import by re-sending it 50 ms later, and by then
        the process could have returned 0: seen once in CI under load)."""
        self.stopped_by = self.stopped_by or sig
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        ending = loop.call_later(self.grace_s, lambda: loop.run_in_executor(None, self.end_requests))
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()
