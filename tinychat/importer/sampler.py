"""The sampler.json an import writes: the checkpoint's own recommendation (a GGUF's general.sampling.* keys, a
folder's generation_config.json), then tinychat's table for the model's family, then the imported-model base
(sampler_defaults.py has the layers and the table)."""
from __future__ import annotations

import json
from pathlib import Path

from .. import sampler_defaults
from .errors import ImportRefused


def model_sampler(src: Path, hints: list[str], context: int | None = None) -> sampler_defaults.ModelDefaults:
    """The defaults for the model imported from src (a GGUF file or an HF folder). hints: names of the model besides
    the file's (the repo id, the chat template's default system prompt) that the family table matches; context: the
    positions a chat on it may hold."""
    hints = [src.name, *hints]
    values, sources, unused = {}, {}, {}
    if src.is_file():
        from .gguf_header import read_metadata
        try:
            with open(src, "rb") as f:
                meta = read_metadata(f, str(src))
        except (OSError, ImportRefused):
            meta = {}
        values, sources, unused = sampler_defaults.from_gguf_fields(meta)
        hints += [str(meta.get(k) or "") for k in ("general.basename", "general.name")]
    else:
        try:
            gen = json.loads((src / "generation_config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            gen = None
        values, sources, unused = sampler_defaults.from_generation_config(gen)
    return sampler_defaults.derive(values, sources, hints, unused, context)
