"""Runs an app with uvicorn on a background thread: for tests, benchmarks and notebooks."""
from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from types import FrameType
from typing import Iterator

import uvicorn
from fastapi import FastAPI

from ember.engine.async_engine import AsyncEngine

log = logging.getLogger("uvicorn.error")  # shown in uvicorn's format, next to its own shutdown lines


class GracefulServer(uvicorn.Server):
    """On SIGTERM/SIGINT: stop accepting, let in-flight requests finish for `drain_timeout` s, abort the rest
    (their streams end with finish_reason "abort"), and return from run() so the process can exit 0."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, drain_timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.drain_timeout = drain_timeout
        self._drain: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is None:
            log.info("shutting down: in-flight requests get up to %.0fs to finish", self.drain_timeout)
            # off the event loop: engine.shutdown blocks while the loop keeps streaming the last tokens
            self._drain = threading.Thread(target=self.engine.shutdown, args=(self.drain_timeout,),
                                           name="ember-drain", daemon=True)
            self._drain.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's version re-raises the caught signal after shutdown (exit status 143 on SIGTERM)
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class ServerThread:
    """`with ServerThread(app) as server: httpx.get(server.url + "/health")`; port 0 picks a free port."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.host = host
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]},
                                        name="ember-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server on {self.url} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
