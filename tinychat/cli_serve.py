"""`tinychat serve`: the OpenAI-compatible HTTP server's flags, checked, handed to tinychat/serve. The server stack
(starlette, uvicorn) and torch are imported only when it runs."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .choices import QUANT_CHOICES
from .cli_common import _QUANTS, MODEL_HELP, UsageError, _model_arg
from .loading import check_choice, check_threads, resolve_device


def serve(model: Optional[Path] = typer.Option(None, "--model", "-m", metavar="PATH|NAME", help=MODEL_HELP, callback=_model_arg),
          quant: str = typer.Option("auto", "--quant", "-q", metavar=_QUANTS, help="auto, none, int8 or bf16 (as for a chat)."),
          device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda", help="auto, cpu or cuda."),
          host: str = typer.Option("127.0.0.1", "--host", metavar="ADDRESS", help="Address to bind (default: loopback only)."),
          port: int = typer.Option(8080, "--port", metavar="N", help="TCP port."),
          api_key: Optional[str] = typer.Option(None, "--api-key", metavar="KEY", envvar="TINYCHAT_API_KEY",
                                                help="Ask every /v1 request for this key (Authorization: Bearer "
                                                     "KEY). Default: $TINYCHAT_API_KEY, else none."),
          max_queue: int = typer.Option(16, "--max-queue", metavar="N", help="Requests that may wait behind the running one; "
                                        "more get 503 with Retry-After."),
          max_tokens: int = typer.Option(4096, "--max-tokens", metavar="N", help="The most max_tokens a request may ask for."),
          max_body: int = typer.Option(1 << 20, "--max-body", metavar="BYTES", help="The largest request body in bytes (413 past it)."),
          save_sessions: Optional[Path] = typer.Option(None, "--save-sessions", metavar="DIR",
                                                       help="Save each request as a session in DIR (`tinychat "
                                                            "replay DIR --check` verifies them)."),
          threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help="CPU threads (as for a chat).")):
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,
    /health): one decoder, requests queued in order. Needs the serve extra: pip install 'tinychat\\[serve]'."""
    from .serve.config import ServeConfig
    from .serve.server import missing_extra
    why = missing_extra()
    if why:
        raise UsageError(why)
    check_choice("--quant", quant, QUANT_CHOICES)
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535 (got {port})")
    for name, v in (("--max-queue", max_queue), ("--max-tokens", max_tokens), ("--max-body", max_body)):
        if v < 1:
            raise UsageError(f"{name} must be at least 1 (got {v})")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty")
    if save_sessions is not None:
        try:
            save_sessions.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--save-sessions {save_sessions}: {e.strerror or e}") from None
    dev = resolve_device(device)
    tune = {}
    if check_threads(threads) is not None:
        import torch
        torch.set_num_threads(threads)
        tune = {"tune_threads": False}
    from .options import EngineOptions
    from .serve.server import serve as run_server
    config = ServeConfig(host=host, port=port, api_key=api_key, max_queue=max_queue, max_request_bytes=max_body,
                         max_tokens=max_tokens, save_sessions=save_sessions)
    raise typer.Exit(run_server(config, model, quant, dev, EngineOptions.from_env(**tune)))
