"""Error bodies in the shapes clients parse: OpenAI's {"error": {...}} and Anthropic's {"type": "error", ...}.

Every user error becomes a 4xx with a message naming the bad field; FastAPI's 422 for a malformed body is
turned into a 400 like OpenAI's, so SDKs raise BadRequestError instead of a generic status error.
"""
from __future__ import annotations

import json
import logging
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}

# status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error"}
_OPENAI_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                 500: "internal_server_error", 503: "service_unavailable"}


class ApiError(Exception):
    """A request that cannot be served; rendered in the caller's API shape by the handlers below."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code


def openai_error_body(message: str, status: int = 400, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def anthropic_error_body(message: str, status: int = 400) -> dict:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def is_anthropic_route(request: Request) -> bool:
    return request.url.path.rstrip("/").endswith("/v1/messages")


def error_response(request: Request, error: ApiError) -> JSONResponse:
    if is_anthropic_route(request):
        body = anthropic_error_body(error.message, error.status)
    else:
        body = openai_error_body(error.message, error.status, error.param, error.code)
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(body, status_code=error.status, headers=headers)


def sse_error(message: str, status: int = 400) -> str:
    """An error in the middle of an OpenAI stream, as vLLM sends it."""
    return f"data: {json.dumps(openai_error_body(message, status))}\n\n"


def _describe(err: dict) -> tuple[str, str | None]:
    """One pydantic error as ('field: what is wrong', 'field')."""
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}", None
    if err.get("type") == "missing" and loc:
        return f"{'.'.join(loc)}: field required", ".".join(loc)
    if not loc:
        return f"the request body is invalid: {err.get('msg')}", None
    # unions report one error per branch: the location's last part names the branch's type, not a field
    field = ".".join(p for p in loc if not _is_type_tag(p))
    return f"{field}: {err.get('msg')} (got {_short(err.get('input'))})", field


def _is_type_tag(part: str) -> bool:
    return part[:1].islower() and ("[" in part or part in {"str", "int", "float", "bool", "list", "dict"})


def _short(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """The first error names the field; several branches of one union are reported once."""
    message, field = _describe(errors[0])
    others = {_describe(e)[1] for e in errors[1:]} - {field}
    if others:
        message += f" (and {len(others)} more invalid field{'s' if len(others) > 1 else ''})"
    return message, field


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body as `model`, whatever the Content-Type (curl -d sends form-encoded), or a 400."""
    raw = await request.body()
    if not raw.strip():
        raise ApiError("the request body is empty; send a JSON object", 400)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(f"the request body is not valid JSON: {e}", 400) from None
    if not isinstance(data, dict):
        raise ApiError(f"the request body must be a JSON object, got a JSON {_JSON_TYPES[type(data)]}", 400)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, field = validation_message(list(e.errors()))
        raise ApiError(message, 400, field) from None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_message(list(exc.errors()))
        return error_response(request, ApiError(message, 400, field))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(request, ApiError(str(exc.detail), exc.status_code))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s", request.url.path)
        return error_response(request, ApiError(f"internal error: {type(exc).__name__}: {exc}", 500))
