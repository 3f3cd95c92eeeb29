"""AsyncEngine: runs EngineCore.step() on its own thread and streams each request's deltas to asyncio callers.

Commands (add, abort) cross into the engine thread through a queue and are applied between steps, so the core
is only ever touched by one thread.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator

from ember.engine.core import EngineCore
from ember.engine.outputs import RequestDelta
from ember.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_hit_tokens: int
    prefix_query_tokens: int


def _put_all(batch: list[tuple[asyncio.Queue, object]]) -> None:
    for stream, item in batch:
        stream.put_nowait(item)


class AsyncEngine:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ember-engine", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> "AsyncEngine":
        self._thread.start()
        return self

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.error is None

    async def generate(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams) -> AsyncIterator[RequestDelta]:
        """Streams deltas until the request finishes. Raises ValueError at once for a request that cannot run.
        Cancelling the consumer (client disconnect) aborts the request and frees its blocks."""
        self.core.validate(prompt_token_ids, params)
        if not self.is_running or self._stopped.is_set():
            raise RuntimeError(f"the engine is not running{f': {self.error}' if self.error else ''}")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[req_id] = (asyncio.get_running_loop(), stream)
        self._send(("add", req_id, prompt_token_ids, params))
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(req_id, None)
            if not finished:
                self._send(("abort", req_id))

    def abort(self, req_id: str) -> None:
        self._send(("abort", req_id))

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _deliver(self, req_id: str, item) -> None:
        self._deliver_many([(req_id, item)])

    def _deliver_many(self, items: list[tuple[str, object]]) -> None:
        """One wake-up per event loop per step, however many requests got output."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for req_id, item in items:
            target = self._streams.get(req_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((target[1], item))
        for loop, batch in by_loop.items():
            loop.call_soon_threadsafe(_put_all, batch)

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, req_id, ids, params = command
                try:
                    self.core.add_request(req_id, ids, params)
                except Exception as e:  # noqa: BLE001 - reported to the caller, the engine goes on
                    self._deliver(req_id, e)
            elif command[0] == "abort":
                delta = self.core.abort(command[1])
                if delta is not None:
                    self._deliver(command[1], delta)

    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                self._apply_commands()
                if not self.core.has_unfinished():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                self._deliver_many([(d.req_id, d) for d in self.core.step()])
            self._apply_commands()  # aborts queued by shutdown still send their final delta
        except BaseException as e:  # noqa: BLE001 - surfaced to every waiting request and /health
            log.exception("engine loop failed")
            self.error = e
        # nothing will answer the streams still open: end them instead of leaving them waiting
        reason = f"engine failure: {self.error}" if self.error else "the engine has stopped"
        self._deliver_many([(req_id, RuntimeError(reason)) for req_id in list(self._streams)])

    def stats(self) -> EngineStats:
        s, pool = self.core.scheduler, self.core.kv.pool
        return EngineStats(len(s.running), len(s.waiting), pool.num_used_blocks, pool.num_blocks - 1,
                           pool.num_hits, pool.num_queries)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Lets in-flight requests finish for up to `timeout` seconds, then aborts the rest and stops."""
        deadline = time.monotonic() + timeout
        while self.core.has_unfinished() and time.monotonic() < deadline and self.is_running:
            time.sleep(0.05)
        for req_id in list(self.core.scheduler.requests):
            self._send(("abort", req_id))
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self.core.close()
