"""Prometheus metrics, one CollectorRegistry per app (so several apps in one process never collide).

Gauges are read from the engine at scrape time; latency histograms and token counters are fed by the
request handlers through a `RequestTracker` per engine request.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ember.engine.async_engine import AsyncEngine
from ember.engine.outputs import RequestDelta

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                120.0, 240.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: AsyncEngine, model_name: str) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.running = Gauge("ember_num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("ember_num_requests_waiting", "Requests waiting to be scheduled", labels, registry=r)
        self.blocks_used = Gauge("ember_kv_cache_blocks_used", "KV cache blocks in use", labels, registry=r)
        self.blocks_total = Gauge("ember_kv_cache_blocks_total", "KV cache blocks in the pool", labels, registry=r)
        self.hit_rate = Gauge("ember_prefix_cache_hit_rate", "Prefix-cache hits / queried tokens since start",
                              labels, registry=r)
        self.ttft = Histogram("ember_time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("ember_time_per_output_token_seconds", "Mean time per output token after the first",
                              labels, buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("ember_e2e_request_latency_seconds", "End-to-end request latency", labels,
                             buckets=_E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter("ember_prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self.generation_tokens = Counter("ember_generation_tokens", "Tokens generated", labels, registry=r)
        self.finished = Counter("ember_request_success", "Finished requests by finish reason",
                                labels + ["finished_reason"], registry=r)
        self.labels = {"model_name": model_name}

    def track(self) -> "RequestTracker":
        return RequestTracker(self)

    def render(self) -> bytes:
        stats = self.engine.stats()
        self.running.labels(**self.labels).set(stats.num_running)
        self.waiting.labels(**self.labels).set(stats.num_waiting)
        self.blocks_used.labels(**self.labels).set(stats.kv_blocks_used)
        self.blocks_total.labels(**self.labels).set(stats.kv_blocks_total)
        rate = stats.prefix_hit_tokens / stats.prefix_query_tokens if stats.prefix_query_tokens else 0.0
        self.hit_rate.labels(**self.labels).set(rate)
        return generate_latest(self.registry)


@dataclass(slots=True)
class RequestTracker:
    """Timings of one engine request, reported once when it ends (finished, aborted or failed)."""

    metrics: ServerMetrics
    start: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    is_done: bool = False

    def observe(self, delta: RequestDelta) -> None:
        if delta.new_token_ids and self.first_token is None:
            self.first_token = time.perf_counter()
        self.num_output_tokens += len(delta.new_token_ids)
        self.num_prompt_tokens = delta.num_prompt_tokens or self.num_prompt_tokens
        if delta.finished:
            self.done(delta.finish_reason or "stop")

    def done(self, finish_reason: str) -> None:
        if self.is_done:
            return
        self.is_done = True
        m, labels, now = self.metrics, self.metrics.labels, time.perf_counter()
        m.finished.labels(finished_reason=finish_reason, **labels).inc()
        m.prompt_tokens.labels(**labels).inc(self.num_prompt_tokens)
        m.generation_tokens.labels(**labels).inc(self.num_output_tokens)
        m.e2e.labels(**labels).observe(now - self.start)
        if self.first_token is not None:
            m.ttft.labels(**labels).observe(self.first_token - self.start)
            if self.num_output_tokens > 1:
                m.tpot.labels(**labels).observe((now - self.first_token) / (self.num_output_tokens - 1))
