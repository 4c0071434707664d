"""How long a server waits on its clients, and how many connections it holds.

Neither uvicorn nor the front timed a client out: a connection that sent half a head, or
trickled a body, or never sent anything, was held for good, and so was one whose client stopped
reading an answer (a stalled SSE reader kept its row until the last token, then its connection
for good). With the process's open-file limit at 200, 250 such connections held `serve --no-ray`
past it: a new client's connection was reset, and 181 were still held 40 s later. Now
(`ClientLimits`, one a server, and a `ClientClock` a connection):

- a request must arrive whole within `timeout_s` of the connection being ready for it (opened,
  or its previous answer sent): past it, 408 as JSON if some of it came, else the connection
  (an idle one) just closes;
- an answer the client takes none of for `timeout_s` ends the connection: its request is
  abandoned, and its row freed, as when a client hangs up;
- past `max_connections` open (by default what the open-file limit leaves), a new connection
  closes the one waiting longest for a request, so a slow or idle client makes room for a
  new one; with none waiting (every connection's request being answered) the new one gets 503.
"""

import logging
import os
import struct
import sys

from seqexport.errors import UsageError
from seqexport.serve.protocol import HTTPError, raw_response

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_GRACE_S = 5.0  # at shutdown, how long the requests in progress may take to finish
ENDING_S = 2.0  # after the grace: for the ended requests' last bytes (503s, error events) to be written out
SWEEP_S = 1.0  # how often the deadlines are looked at (more often for a shorter timeout)


def _files_held() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux
        return 64


def _left(soft: int, held: int) -> int:
    """Connections an open-file limit of `soft` leaves: less the files held, less an eighth of
    it (at least 64) kept back for what the process opens later (a connection past the limit
    is then refused by us, not by accept() failing, which resets the client and retries only
    a second later)."""
    return soft - held - max(64, soft // 8)


def default_max_connections() -> int:
    """What this process's open-file limit leaves for client connections, with the files it
    holds now (the model, the engine's threads, Ray's)."""
    import resource  # (POSIX: imported where used, so the CLI still imports elsewhere)

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(8, _left(soft, _files_held()))


def make_room_for(max_connections: int) -> None:
    """Raise this process's open-file limit (its soft one, up to the hard one) so it leaves room
    for `max_connections`, or UsageError naming both limits: past the open-file limit, accept()
    fails and new clients are reset however many connections the server means to hold."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = _files_held()
    if soft == resource.RLIM_INFINITY or _left(soft, held) >= max_connections:
        return
    need = max(held + max_connections + 64, -(-(held + max_connections) * 8 // 7))
    if hard != resource.RLIM_INFINITY and need > hard:
        raise UsageError(f"--max-connections {max_connections}: the open-file limit (soft {soft}, hard {hard}) "
                         f"leaves room for {max(0, _left(hard, held))}; raise it (ulimit -n, or LimitNOFILE "
                         "under systemd) or ask for fewer")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def untaken(transport) -> int:
    """Bytes written for the client that it has not taken: the transport's buffer and, on
    Linux, the socket's send queue (SIOCOUTQ: sent but not acknowledged, or not sent)."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None and sys.platform.startswith("linux"):  # (elsewhere TIOCOUTQ is a tty's)
        import fcntl
        import termios

        try:  # TIOCOUTQ is SIOCOUTQ's number on Linux
            size += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        except OSError:  # closed meanwhile, or not a socket the kernel counts this for
            pass
    return size


def request_timed_out(timeout_s: float) -> HTTPError:
    return HTTPError(408, f"the request did not arrive whole within {timeout_s:g} s of the connection being "
                          "ready for it (--client-timeout); send it again", kind="request_timeout")


def too_many_connections(limit: int) -> HTTPError:
    return HTTPError(503, f"this server holds {limit} connections (--max-connections), each with a request "
                          "being answered; retry", kind="server_busy", headers={"Retry-After": "1"})


class ClientClock:
    """One connection's times, for `ClientLimits`: its protocol calls `ready` (nothing left to
    answer: waiting for a request), `began` (a request's first bytes), `ended` (its last),
    `answering` (a whole request waits for, or gets, its answer), `write_paused` /
    `write_resumed` (the transport's flow control), `lost` (connection_lost)."""

    __slots__ = ("limits", "transport", "waiting_since", "partial", "stalled_since", "buffered")

    def __init__(self, limits: "ClientLimits", transport, now: float):
        self.limits, self.transport = limits, transport
        self.waiting_since: float | None = now  # ready for a request not yet whole, since when
        self.partial = False  # some of that request has come
        self.stalled_since: float | None = None  # the client taking none of the answer, since when
        self.buffered = 0  # bytes of the answer held for the client at the last look

    def ready(self) -> None:
        self.waiting_since = self.limits.now()

    def began(self) -> None:
        self.partial = True

    def ended(self) -> None:
        self.partial = False

    def answering(self) -> None:
        self.waiting_since = None

    def write_paused(self) -> None:
        self.stalled_since = self.limits.now()
        self.buffered = untaken(self.transport)

    def write_resumed(self) -> None:
        self.stalled_since = None

    def lost(self) -> None:
        self.limits.connections.pop(self, None)

    def late(self, now: float) -> bool:
        """Close the connection if it is past a deadline; whether it was."""
        timeout = self.limits.timeout_s
        if self.stalled_since is not None and self._took_some():
            self.stalled_since = now  # a slow reader, not a stalled one
        if self.stalled_since is not None and now - self.stalled_since >= timeout:
            log.debug("a client took none of its answer for %g s: connection cut", timeout)
            self.transport.abort()  # close() would wait for the buffer to drain: it never will
        elif self.waiting_since is not None and now - self.waiting_since >= timeout:
            self.close_waiting()
        else:
            return False
        self.lost()
        return True

    def _took_some(self) -> bool:
        """Whether the client took some of its answer since the last look: while writing is
        paused nothing more is written, so what is untaken shrinks only as the client reads.
        (Writing stays paused until the transport's buffer drains to a quarter of its
        high-water mark, and the transport's buffer moves into the kernel's only once a third
        of the kernel's is free: a client reading 10 KB/s stayed paused, the transport's buffer
        unchanged, for minutes, and was cut as if it read nothing.)"""
        size = untaken(self.transport)
        took, self.buffered = size < self.buffered, size
        return took

    def close_waiting(self) -> None:
        """A connection no request of which is being answered: 408 if a request began, else just closed."""
        if self.partial:
            self.transport.write(raw_response(request_timed_out(self.limits.timeout_s), close=True))
        self.transport.close()


class ClientLimits:
    """A server's rules for its client connections (module docstring); `opened(transport)` from
    its protocol's connection_made gives the connection's `ClientClock`, or None when it was
    refused (503 written, the transport closed)."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, max_connections: int | None = None,
                 shutdown_grace_s: float = DEFAULT_GRACE_S):
        self.timeout_s = timeout_s
        # on SIGTERM / Ctrl-C: no new connections; the requests in progress may take this long,
        # then each ends with 503 "shutting down; retry" (a stream: an error event and [DONE])
        self.shutdown_grace_s = shutdown_grace_s
        self.max_connections = max_connections  # None: default_max_connections() at the first connection
        self.connections: dict[ClientClock, None] = {}  # the open ones (a dict: ordered, O(1) removal)
        self._loop = self._sweep = None

    def now(self) -> float:
        return self._loop.time()

    def opened(self, transport) -> ClientClock | None:
        import asyncio

        if self._loop is None:  # serving: what the process holds now is known (the model loaded, Ray started)
            self._loop = asyncio.get_running_loop()
            self.max_connections = self.max_connections or default_max_connections()
        if len(self.connections) >= self.max_connections and not self._make_room():
            transport.write(raw_response(too_many_connections(self.max_connections), close=True))
            transport.close()
            return None
        clock = ClientClock(self, transport, self.now())
        self.connections[clock] = None
        if self._sweep is None:
            self._sweep = self._loop.call_later(self._every(), self._look)
        return clock

    def _make_room(self) -> bool:
        """Close the connection waiting longest for a request; whether there was one."""
        waiting = [c for c in self.connections if c.waiting_since is not None]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.waiting_since)
        log.debug("%d connections open: the one waiting longest closed for a new one", len(self.connections))
        oldest.close_waiting()
        oldest.lost()
        return True

    def _every(self) -> float:
        return min(SWEEP_S, self.timeout_s / 4)

    def _look(self) -> None:
        """Every `_every()` seconds while connections are open: close those past a deadline."""
        now = self.now()
        for clock in list(self.connections):
            clock.late(now)
        self._sweep = self._loop.call_later(self._every(), self._look) if self.connections else None
