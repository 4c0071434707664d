"""Prometheus metrics of one server (one registry per app, so several apps in one process,
e.g. tests, do not collide): queue length, active rows, tokens/s, time to first token and
time per output token histograms, requests by how they ended."""

import threading
import time
from collections import deque

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST  # of the /metrics answer

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


class RateMeter:
    """Events per second over the last `window` seconds (thread-safe)."""

    def __init__(self, window: float = 10.0):
        self.window = window
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def add(self, now: float) -> None:
        with self._lock:
            self._times.append(now)

    def rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._times and self._times[0] < now - self.window:
                self._times.popleft()
            return len(self._times) / self.window


class ServerMetrics:
    def __init__(self, engine):
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("seqexport_queue_length", "Requests waiting for a row", registry=r).set_function(
            lambda: engine.queue_length)
        Gauge("seqexport_active_rows", "Requests decoding in the running batch", registry=r).set_function(
            lambda: engine.active_rows)
        Gauge("seqexport_parked_rows", "Rows held back because their client is behind its stream",
              registry=r).set_function(lambda: engine.parked_rows)
        Gauge("seqexport_state_bytes", "Bytes of the running batch's cache/state", registry=r).set_function(
            lambda: engine.state_bytes)
        self.rate = RateMeter()
        Gauge("seqexport_tokens_per_second", "Generated tokens per second over the last 10 s",
              registry=r).set_function(self.rate.rate)
        self.tokens = Counter("seqexport_generated_tokens", "Generated tokens", registry=r)
        self.prompt_tokens = Counter("seqexport_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.ttft = Histogram("seqexport_time_to_first_token_seconds", "Submit to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("seqexport_time_per_output_token_seconds", "Gap between a request's tokens",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("seqexport_requests", "Finished requests by finish reason",
                                ["finish_reason"], registry=r)
        self.rejected = Counter("seqexport_rejected_requests", "Requests refused (4xx, or 503 queue full)",
                                ["status"], registry=r)

    def on_token(self, req) -> None:
        """Called on the engine thread after each token of `req`."""
        times = req.token_times
        self.tokens.inc()
        self.rate.add(times[-1])
        if len(times) == 1:
            self.ttft.observe(times[0] - req.submitted)
        else:
            self.tpot.observe(times[-1] - times[-2])

    def on_end(self, req) -> None:
        self.requests.labels(req.finish_reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
