"""`tinychat serve`: load the model, build the app, run it under uvicorn until Ctrl-C. The CLI imports this module
only when `serve` runs (Starlette and uvicorn are the `serve` extra)."""
from __future__ import annotations

import sys
from pathlib import Path

from .config import ServeConfig


def missing_extra() -> str | None:
    """One line when the serve extra is not installed, else None."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        return f"tinychat serve needs {e.name or 'its extra'}: pip install 'tinychat[serve]'"
    return None


def build(config: ServeConfig, model: Path | None, quant: str, device: str, options=None):
    """(app, runner): the model loaded (quant: a choice, `auto` resolved here) and the app over it."""
    from tinychat.loading import load_runtime, resolve_quant

    from .app import create_app
    from .runtime import ChatRunner
    mode, why = resolve_quant(quant, device)
    rt = load_runtime(model, mode)
    runner = ChatRunner(rt, mode, device, options, save_dir=config.save_sessions, quant_why=why)
    return create_app(runner, config), runner


def serve(config: ServeConfig, model: Path | None, quant: str, device: str, options=None) -> int:
    import uvicorn
    if config.exposed_without_key():
        print(f"warning: serving on {config.host} without an API key: anyone who can reach port {config.port} can "
              f"use the model (set --api-key or TINYCHAT_API_KEY)", file=sys.stderr, flush=True)
    app, runner = build(config, model, quant, device, options)
    st = runner.status()
    print(f"tinychat serve: model {runner.model_id!r} ({st['mode']}, {st['quant']}) on http://{config.host}:"
          f"{config.port}/v1" + (f", sessions saved in {config.save_sessions}" if config.save_sessions else ""),
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0
