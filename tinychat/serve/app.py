"""The Starlette app: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`.

Every /v1 route checks the API key (when one is set: `Authorization: Bearer KEY`, compared in constant time); a
body is read up to max_request_bytes (413 past it, before any parsing); each request is validated (schema.py),
queued (worker.py: 503 + Retry-After when the queue is full) and answered once its turn has begun, so an error of the
turn itself (a conversation longer than the context) is still a plain 400, not a broken stream. A client that goes
away -- while it waits, while a reply is decoded for it or while it streams -- cancels its job: skipped in the queue,
or stopped at its next token."""
from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..numbers import is_count
from .config import ServeConfig
from .errors import ApiError, bad
from .schema import parse_chat, parse_completion
from .sse import DONE_LINE, Reply, event
from .worker import DELTA, DONE, ERROR, Job, Worker


STREAM_PACE_S = 0.02     # a streamed reply's chunks: at most one per 20 ms (about 8 tokens at 400 tok/s)
WHOLE_PACE_S = 0.05      # a whole reply's coroutine looks at its job at most this often


def _split(batch: list) -> tuple[list, tuple | None]:
    """(the Deltas of a batch, its ending event (DONE or ERROR, value) or None)."""
    deltas = [v for k, v in batch if k == DELTA]
    end = next(((k, v) for k, v in batch if k != DELTA), None)
    return deltas, end


def _merge(deltas: list) -> tuple[str, list, list]:
    """Deltas as one: (text, logprobs entries, their offsets)."""
    return ("".join(d.text for d in deltas), [e for d in deltas for e in d.entries],
            [o for d in deltas for o in d.offsets])


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class JobStream(StreamingResponse):
    """A streamed reply whose job is cancelled however the response ends (finished, client gone, send failed)."""

    def __init__(self, content, job: Job):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()               # a no-op once the job is done


def create_app(runner, config: ServeConfig) -> Starlette:
    """The app over `runner` (runtime.ChatRunner, or anything with its run / cancel / model_id)."""
    worker = Worker(runner, config.max_queue)

    def check_key(request: Request) -> None:
        if config.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode("utf-8"), config.api_key.encode("utf-8")):
            raise ApiError(401, "Incorrect or missing API key (send it as `Authorization: Bearer KEY`)",
                           code="invalid_api_key")

    async def read_json(request: Request):
        cap = config.max_request_bytes
        too_big = ApiError(413, f"The request body is larger than this server takes ({cap:,} bytes)",
                           code="request_too_large")
        length = request.headers.get("content-length")
        if length is not None and (not is_count(length) or int(length) > cap):   # "²".isdigit(), int("²") raises
            raise too_big if is_count(length) else bad("bad Content-Length")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cap:
                raise too_big
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise bad("the request body is not valid JSON") from None

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": runner.model_id, "queued": worker.queued(),
                             "running": worker.running is not None, "served": worker.served})

    def model_card() -> dict:
        return {"id": runner.model_id, "object": "model", "created": 0, "owned_by": "tinychat"}

    async def models(request: Request):
        check_key(request)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request: Request):
        check_key(request)
        if request.path_params["model"] != runner.model_id:
            raise ApiError(404, f"The model {request.path_params['model'][:100]!r} does not exist", "model",
                           "model_not_found")
        return JSONResponse(model_card())

    async def watch(request: Request, job: Job) -> None:
        """Cancel the job when the client disconnects (the body is read: receive() waits for the disconnect)."""
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                job.cancel()
                return

    async def complete(request: Request, parse):
        check_key(request)
        req = parse(await read_json(request), runner.model_id, config.max_tokens)
        job = Job(req)
        worker.submit(job)
        reply = Reply(req.kind, job.seq, req.model, req.logprobs)
        watcher = asyncio.create_task(watch(request, job))
        try:
            deltas, end = _split(await job.next_batch())   # the turn has begun (or failed, or ended at once)
            if end is not None and end[0] == ERROR and not deltas:
                raise end[1]
            if req.stream:
                return JobStream(stream(job, reply, deltas, end, req.include_usage), job)
            while end is None:
                await job.pace(WHOLE_PACE_S)
                more, end = _split(await job.next_batch())
                deltas += more
            if end[0] == ERROR:
                raise end[1]
            text, entries, offsets = _merge(deltas)
            return JSONResponse(reply.whole(text, entries, offsets, end[1]))
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            watcher.cancel()

    async def stream(job: Job, reply: Reply, deltas: list, end, include_usage: bool):
        """SSE chunks: what has arrived since the last chunk goes out as one, at most every STREAM_PACE_S (a slow
        reader gets fewer, larger chunks; the decoder never waits for the network)."""
        head = reply.first_chunk()
        if head is not None:
            yield head
        while True:
            if deltas:
                yield reply.delta_chunk(*_merge(deltas))
            if end is not None:
                if end[0] == DONE:
                    yield reply.last_chunks(end[1], include_usage)
                else:
                    yield event(end[1].body()) + DONE_LINE
                return
            await job.pace(STREAM_PACE_S)
            deltas, end = _split(await job.next_batch())

    async def chat_completions(request: Request):
        return await complete(request, parse_chat)

    async def completions(request: Request):
        return await complete(request, parse_completion)

    async def api_error(request: Request, exc: ApiError):
        return error_response(exc)

    async def http_error(request: Request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                       code=code))

    async def internal_error(request: Request, exc: Exception):
        return error_response(ApiError(500, "internal error (the server's log has the traceback)",
                                       code="internal_error"))

    @asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(worker.stop)

    app = Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", one_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ], exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: internal_error}, lifespan=lifespan)
    app.state.worker, app.state.runner, app.state.config = worker, runner, config
    return app
