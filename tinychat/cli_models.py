"""`tinychat pull`, `tinychat import` and `tinychat models`: models from the Hugging Face Hub or a folder, imported
under the data folder, listed and removed. huggingface_hub, the importer and torch are imported inside the commands."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from .cli_common import UsageError, _progress

QUANT_HELP = ("How the weights are stored. auto: as a GGUF's own bits say: 5 to 8 bits (Q8_0, Q6_K) int8, Q4_0 "
              "int4, other 4-bit types (Q4_K_M) int4 (int8 under 300M parameters), float weights and safetensors "
              "full precision. "
              "none: full precision (--dtype); int8 / int4: packed, as --quant makes them at start (a fraction of "
              "the disk, nothing quantized at load).")


def pull(ref: str = typer.Argument(..., metavar="REPO[:QUANT][@REVISION]",
                                   help="A model on the Hugging Face Hub, ORG/NAME; :QUANT picks a GGUF file (default "
                                        "Q8_0, else the closest); @REVISION a branch, tag or commit."),
         name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="The model's name (default: the repo's name, with the "
                                            "quant for a GGUF: SmolLM2-360M-Instruct-Q8_0)."),
         list_: bool = typer.Option(False, "--list", help="Show the repo's GGUF quants and sizes (or the files a "
                                    "safetensors repo needs); pull nothing."),
         offline: bool = typer.Option(False, "--offline", help="Use only the Hugging Face cache, no network "
                                      "(also HF_HUB_OFFLINE=1)."),
         quant: str = typer.Option("auto", "--quant", metavar="auto|none|int8|int4", help=QUANT_HELP),
         force: bool = typer.Option(False, "--force", help="Replace a model of the same name pulled from elsewhere.")):
    """Download a model from the Hugging Face Hub into its standard cache, then import it (`tinychat import`).

    The files go where huggingface_hub keeps them (HF_HOME / HF_HUB_CACHE; llama.cpp, mlx and `hf download` find
    them there too); the imported model under the data folder. HF_TOKEN opens gated repos, HF_ENDPOINT points at a
    mirror. The size is shown first, and a disk without room refused. Run an interrupted pull again to finish it."""
    if offline:     # the whole client offline (read by huggingface_hub when it is imported, just below)
        os.environ["HF_HUB_OFFLINE"] = "1"
    from .hub.pull import Interrupted, plan
    if list_:
        _list_pull(plan(ref, offline))
        return
    try:
        r = _run_pull(ref, name=name, offline=offline, force=force, quant=quant)
    except Interrupted as e:
        from .hub.ref import human_bytes
        typer.echo(f"interrupted at {human_bytes(e.done)} of {human_bytes(e.total)}: `tinychat pull {ref}` resumes "
                   f"the download (nothing was imported)", err=True)
        raise typer.Exit(130)
    from .textsafe import safe_text
    if r.up_to_date:
        typer.echo(safe_text(f"{r.name} is up to date ({r.plan.ref.repo} at {r.plan.commit[:12]})\n"
                             f"chat with: tinychat --model {r.name}"))
    else:
        typer.echo(safe_text(f"pulled {r.plan.ref} as {r.name} ({r.path})\n{stored_line(r.path)}\n"
                             f"chat with: tinychat --model {r.name}"))


def _run_pull(ref: str, **kw):
    """hub.pull.pull on the console: the download's bar and lines, then the import's progress line (as `tinychat
    import` shows it)."""
    from contextlib import ExitStack

    from .hub.progress import ConsoleReport
    from .hub.pull import Interrupted
    from .hub.pull import pull as run_pull
    report = ConsoleReport()
    with ExitStack() as stack:
        shown = []

        def import_progress(done: int, total: int, what: str) -> None:
            if not shown:
                report.close()              # the download's summary line, before the import's progress line
                shown.append(stack.enter_context(_progress(f"import {ref}"))[0] or (lambda *a: None))
            shown[0](done, total, what)
        try:
            return run_pull(ref, report=report, import_progress=import_progress, **kw)
        except Interrupted:
            report.close(summary=False)
            raise
        finally:
            report.close()


def stored_line(folder: Path) -> str:
    """"weights: ..." for an import's summary: the mode its import.json records, and why when --quant auto chose."""
    import json

    from .importer.store import IMPORT_FILE
    from .textsafe import safe_line
    try:
        meta = json.loads((Path(folder) / IMPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    mode = meta.get("quant") or "none"
    what = f"{mode}, packed" if mode in ("int8", "int4") else f"full precision, {meta.get('dtype') or 'float32'}"
    why = meta.get("quant_why")
    return safe_line(f"weights: {what}" + (f" ({why})" if isinstance(why, str) and why else ""))


def _list_pull(p) -> None:
    """A repo's files as the Hub (or a cache folder) lists them: their names are someone else's text, escaped."""
    from .hub.ref import human_bytes
    from .textsafe import safe_line
    where = " (in the cache)" if p.offline else ""
    if p.kind == "gguf":
        typer.echo(safe_line(f"{p.ref.repo} at {p.commit[:12]}{where}: GGUF files by quant (pull one with "
                             f"tinychat pull {p.ref.repo}:QUANT)"))
        for c in p.choices:
            mark = "  (default)" if c is p.choice and not p.ref.quant else ""
            split = f" (split in {len(c.files)}: not importable)" if c.split else ""
            typer.echo(safe_line(f"  {c.quant:10} {human_bytes(c.size):>10}  {c.files[0]}{split}{mark}"))
        return
    st = sorted(f for f in p.sizes if f.endswith(".safetensors") and "/" not in f)
    files = [f for f in p.files if not f.endswith(".safetensors")] + st
    typer.echo(safe_line(f"{p.ref.repo} at {p.commit[:12]}{where}: safetensors; a pull fetches {', '.join(files)} "
                         f"({human_bytes(sum(p.sizes.get(f, 0) for f in files))})"))


def import_(src_text: str = typer.Argument(..., metavar="SRC", help="A Hugging Face llama-family folder, a .gguf file, or "
                                       "the id of a repo in the Hugging Face cache (ORG/NAME[:QUANT])."),
            name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="The model's name (default: from SRC)."),
            context: Optional[int] = typer.Option(None, "--context", metavar="N", help="Most positions a chat may hold "
                                                  "(default: 4096, or less when the checkpoint says so)."),
            dtype: str = typer.Option("float32", "--dtype", metavar="float32|bfloat16|float16", help="Stored weights: float32 (exact), bfloat16 or float16."),
            quant: str = typer.Option("auto", "--quant", metavar="auto|none|int8|int4", help=QUANT_HELP),
            force: bool = typer.Option(False, "--force", help="Replace a model of the same name.")):
    """Import a llama-family checkpoint (SmolLM2, Qwen2.5, Llama-architecture models) as a tinychat model.

    The result goes under the data folder and opens with `tinychat --model NAME`. Mixture-of-experts, sliding-window
    and other architectures the engine cannot run are refused with the reason."""
    from .importer import import_model
    if not src_text.strip():        # (a Path argument would have turned "" into ".", the current folder)
        raise UsageError("SRC is empty: give a model folder, a .gguf file or a Hugging Face repo id (ORG/NAME)")
    src = Path(src_text)
    if not src.exists():
        from .hub.ref import is_repo_id, parse_ref
        if is_repo_id(str(src)) and not str(src).lower().endswith(".gguf"):   # from the HF cache, never the network
            from .hub.cache import hub_cache, snapshot_for
            if snapshot_for(parse_ref(str(src))) is None:
                raise UsageError(f"{src}: no such file or folder here, nor a repo in the Hugging Face cache "
                                 f"({hub_cache()}): tinychat pull {src} downloads it")
            r = _run_pull(str(src), name=name, offline=True, force=force, context=context, dtype=dtype, quant=quant)
            from .textsafe import safe_text
            typer.echo(safe_text(f"imported {r.plan.ref} from the Hugging Face cache as {r.name} ({r.path})\n"
                                 f"{stored_line(r.path)}\nchat with: tinychat --model {r.name}"))
            return
    with _progress(f"import {src.name}") as (progress, _):
        dest = import_model(src, name=name, context=context, dtype=dtype, force=force, progress=progress, quant=quant)
    from .textsafe import safe_line
    typer.echo(safe_line(f"imported {src} as {dest.name} ({dest})"))
    typer.echo(stored_line(dest))
    typer.echo(f"chat with: tinychat --model {dest.name}")


models_app = typer.Typer(help="Imported models: list them (plain `tinychat models`), rm NAME.",
                         invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})


@models_app.callback(invoke_without_command=True)
def models_(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="A JSON list (models in the "
                                                              "Hugging Face cache follow, with \"imported\": false).")):
    """List the imported models (`tinychat import`, `tinychat pull`) with their size on disk, then the models in the
    Hugging Face cache that could be imported without downloading (`tinychat import REPO`)."""
    if ctx.invoked_subcommand is not None:
        return
    from .importer.store import human_bytes, list_models
    from .textsafe import safe_line
    rows = list_models()
    cached = _cached_not_imported(rows)
    if json_out:
        import json
        typer.echo(json.dumps(rows + cached))
        return
    if not rows:
        typer.echo("no imported models (add one with: tinychat pull ORG/NAME, or tinychat import SRC)")
    for r in rows:
        params = f"{r['params'] / 1e6:.0f}M params" if r.get("params") else "?"
        stored = f"  stored {r['quant']}" if r.get("quant") else ""
        if r.get("older_layout"):
            stored += " (an older layout, converted at every start: import it again)"
        typer.echo(safe_line(f"{r['name']}  {params}  {human_bytes(r['disk_bytes'])} on disk{stored}  {r['format']}  "
                             f"from {r['source']}"))
    if rows:
        total = sum(r["disk_bytes"] for r in rows)
        typer.echo(safe_line(f"{len(rows)} model{'s' if len(rows) != 1 else ''}, {human_bytes(total)} on disk in "
                             f"{Path(rows[0]['path']).parent}"), err=True)
    if cached:
        from .hub.cache import hub_cache
        typer.echo(safe_line(f"\nin the Hugging Face cache ({hub_cache()}), to import without downloading:"))
        for c in cached:
            typer.echo(safe_line(f"  tinychat import {c['repo']:40}  {c['format']}  {c['bytes'] / 2**20:.0f} MiB"
                                 + (f"  ({', '.join(c['quants'])})" if c["quants"] else "")))


@models_app.command("rm")
def models_rm(name: str = typer.Argument(..., metavar="NAME", help="An imported model's name (`tinychat models`).")):
    """Delete an imported model; refused while a chat has it open (or an import writes it)."""
    from .importer.store import remove_model
    from .textsafe import safe_line
    path = remove_model(name)
    typer.echo(safe_line(f"deleted {name} ({path})"), err=True)


def _cached_not_imported(rows: list[dict]) -> list[dict]:
    """The importable repos of the Hugging Face cache that no imported model was pulled from (at that commit);
    [] without huggingface_hub."""
    try:
        from .hub.cache import cached_repos
        repos = cached_repos()
    except Exception:  # noqa: BLE001  no huggingface_hub, an unreadable cache: list the imported models alone
        return []
    import json
    have = set()
    for r in rows:
        try:
            hub = json.loads((Path(r["path"]) / "import.json").read_text(encoding="utf-8")).get("hub") or {}
            have.add((hub.get("repo"), hub.get("commit")))
        except (OSError, ValueError, AttributeError):
            continue
    return [{"name": None, "repo": c.repo, "imported": False, "path": str(c.snapshot), "source":
             f"{c.repo}@{c.commit[:12]} (Hugging Face cache)", "format": c.kind, "params": None, "bytes": c.size,
             "quants": c.quants} for c in repos if (c.repo, c.commit) not in have]
