"""The FastAPI app: OpenAI routes, Anthropic /v1/messages, /v1/models, /health, /metrics, API-key auth."""
from __future__ import annotations

import secrets

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ember import __version__
from ember.engine.async_engine import AsyncEngine
from ember.server import anthropic, openai
from ember.server.errors import anthropic_error_body, install_error_handlers, openai_error_body
from ember.server.generation import ServerState
from ember.server.metrics import ServerMetrics
from ember.server.protocol import ModelCard, ModelList


class ApiKeyMiddleware:
    """Every /v1 route needs `Authorization: Bearer KEY` (or Anthropic's `x-api-key`); others stay open.

    A plain ASGI middleware, not BaseHTTPMiddleware, so streaming and disconnect detection are untouched.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1") or self._is_authorized(scope):
            await self.app(scope, receive, send)
            return
        message = "invalid or missing API key: send the header `Authorization: Bearer <key>`"
        is_anthropic = scope["path"].rstrip("/").endswith("/v1/messages")
        body = (anthropic_error_body(message, 401) if is_anthropic
                else openai_error_body(message, 401, None, "invalid_api_key"))
        response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _is_authorized(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        bearer = headers.get(b"authorization", b"")
        candidates = [bearer[7:].strip() if bearer[:7].lower() == b"bearer " else b"", headers.get(b"x-api-key", b"")]
        return any(secrets.compare_digest(c, self.api_key) for c in candidates if c)


def build_app(engine: AsyncEngine, served_model_name: str, api_key: str | None = None) -> FastAPI:
    """An app serving `engine` (already started) under the model name `served_model_name`."""
    if not served_model_name:
        raise ValueError("served_model_name must be a non-empty string")
    app = FastAPI(title="ember", version=__version__, description="ember: OpenAI- and Anthropic-compatible API")
    state = ServerState(engine, served_model_name, ServerMetrics(engine, served_model_name))
    app.state.ember = state
    install_error_handlers(app)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.include_router(openai.router)
    app.include_router(anthropic.router)

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        card = ModelCard(id=state.model_name, created=state.created, max_model_len=state.core.max_model_len)
        return ModelList(data=[card])

    @app.get("/health")
    async def health() -> Response:
        if engine.is_running:
            return JSONResponse({"status": "ok"})
        reason = f"engine failed: {engine.error}" if engine.error is not None else "engine is not running"
        return JSONResponse(openai_error_body(reason, 503), status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    return app
