"""The `tinychat` command. Thin: parses flags and hands over to the chat runtime, the app or the benchmark.
torch, the engine and Textual are imported inside the commands, so `tinychat --help` is instant."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode="rich",
                  help="Chat with a small local TinyAgentLM model in the terminal.",
                  context_settings={"help_option_names": ["-h", "--help"]})

SIZES = ("tiny", "demo", "full")


class UsageError(Exception):
    """A bad flag or argument: one line on stderr, exit 2."""


def _debug() -> bool:
    return bool(os.environ.get("TINYCHAT_DEBUG"))


def default_model_path() -> Path | None:
    """The model shipped with tinychat: tinychat/assets (installed) or assets/ beside the package (a checkout)."""
    here = Path(__file__).resolve().parent
    for p in (here / "assets", here.parent / "assets"):
        if (p / "config.json").is_file():
            return p
    return None


def load_model_for(model: Optional[Path], config: Optional[str], seed: int = 0):
    """(model, description): a checkpoint folder, a named size with random weights, or the shipped model."""
    import torch

    from .model import TinyAgentLM, config_for
    if model is not None and config is not None:
        raise UsageError("give --model or --config, not both")
    if config is not None:
        if config not in SIZES:
            raise UsageError(f"--config must be one of {', '.join(SIZES)} (got {config!r})")
        torch.manual_seed(seed)
        with torch.no_grad():
            m = TinyAgentLM(config_for(config))
        return m.eval(), f"{config} (random weights)"
    path = model if model is not None else default_model_path()
    if path is None:
        raise UsageError("no model given and no default model is shipped in this install; "
                         "use --model PATH (a folder with config.json and model.safetensors)")
    return TinyAgentLM.from_pretrained(path), str(path)


@app.callback(invoke_without_command=True)
def chat(ctx: typer.Context,
         model: Optional[Path] = typer.Option(None, "--model", "-m", help="Model folder (default: the shipped model)."),
         ):
    """Chat with a small local TinyAgentLM model. Subcommands: info."""
    if ctx.invoked_subcommand is not None:
        return
    info(model=model, config=None, json_out=False)   # until the chat runtime lands: the model summary


@app.command()
def info(model: Optional[Path] = typer.Option(None, "--model", "-m", help="Model folder (default: the shipped model)."),
         config: Optional[str] = typer.Option(None, "--config", help="A named size with random weights: tiny, demo, full."),
         json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Model summary: parameters, layers, and the KV-cache size per token next to a standard GQA cache."""
    m, desc = load_model_for(model, config)
    c = m.cfg
    facts = {
        "model": desc, "params": m.num_params(), "linear_params": m.num_linear_params(),
        "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layers": c.n_layers, "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "kv_group": c.kv_group, "swa_window": c.swa_window,
        "max_seq_len": c.max_seq_len, "engram_layers": list(c.engram_layers), "engram_orders": list(c.engram_orders),
        "kv_bytes_per_token": c.kv_bytes_per_token(2), "gqa_kv_bytes_per_token": c.gqa_kv_bytes_per_token(2),
        "ring_bytes": c.ring_bytes(2),
    }
    if json_out:
        import json
        typer.echo(json.dumps(facts))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"TinyAgentLM — {desc}", show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("parameters", f"{facts['params'] / 1e6:.2f} M")
    t.add_row("Linear parameters", f"{facts['linear_params'] / 1e6:.2f} M")
    t.add_row("layers / groups", f"{c.n_layers} / {c.n_groups} (kv_group {c.kv_group})")
    t.add_row("heads / kv heads / head dim", f"{c.n_heads} / {c.n_kv_heads} / {c.head_dim}")
    t.add_row("d_model / mlp", f"{c.d_model} / {c.mlp_hidden}")
    t.add_row("vocab / context", f"{c.vocab_size} / {c.max_seq_len}")
    t.add_row("local window", f"{c.swa_window}")
    t.add_row("Engram", f"layers {list(c.engram_layers)}, orders {list(c.engram_orders)}" if c.has_engram else "none")
    t.add_row("KV bytes / token (bf16)", f"{facts['kv_bytes_per_token']:,}")
    t.add_row("standard GQA cache / token", f"{facts['gqa_kv_bytes_per_token']:,} "
              f"({facts['gqa_kv_bytes_per_token'] / facts['kv_bytes_per_token']:.1f}x)")
    t.add_row("fixed local rings", f"{facts['ring_bytes'] / 1024:,.0f} KiB")
    Console().print(t)


def main() -> None:
    """Entry point: run the Typer app; expected failures become one line on stderr and exit 2 (TINYCHAT_DEBUG=1
    or --debug shows the traceback)."""
    if "--debug" in sys.argv:
        sys.argv.remove("--debug")
        os.environ["TINYCHAT_DEBUG"] = "1"
    try:
        app(standalone_mode=False)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001  one line for the user; the traceback with --debug
        import click
        if isinstance(e, click.exceptions.Abort):
            sys.exit(130)
        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(2)
        if _debug():
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"tinychat: error: {msg}", file=sys.stderr)
        sys.exit(2)
