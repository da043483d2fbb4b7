"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the status the API uses (400 bad
request, 401 key, 404 model, 413 too large, 503 queue full with Retry-After, 500 only for bugs)."""
from __future__ import annotations

from ..errors import TinychatError

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error", 500: "server_error"}


class ApiError(TinychatError):
    """An error a request gets back: status, one-line message, the parameter it is about and OpenAI's code (a
    TinychatError: the client's to fix, or the queue's state, never a bug)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 about `param`."""
    return ApiError(400, message, param, code)
