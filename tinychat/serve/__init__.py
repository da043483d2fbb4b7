"""`tinychat serve`: the model over an OpenAI-compatible HTTP API (issue #30), with tinychat's sampler as extension
fields, each token's choice explained in its logprobs entry, and every request replayable as a session.

One concern per module, top to bottom (nothing here imports Starlette or torch at package import):
    server.py    load the model, build the app, run uvicorn (what `tinychat serve` calls)
    app.py       the Starlette app: routes, API key, request size cap, OpenAI-shaped errors
    sse.py       response bodies: chat / text completion objects and their SSE chunks
    worker.py    the one decoder's FIFO queue (bounded) and the thread that owns it; cancel on disconnect
    runtime.py   the adapter to the chat runtime: a request's messages onto the Chat (prefix reuse), one turn
    stops.py     stop strings over streamed text (held back while they may be starting)
    logprobs.py  a token's trace as an OpenAI logprobs entry with its `tinychat` field
    saving.py    `--save-sessions`: each request saved as a tinychat session
    schema.py    request bodies validated into a TurnRequest (400 with the offending parameter)
    errors.py    ApiError and OpenAI's error body
    config.py    ServeConfig: the server's limits and options (torch-free)"""
