"""Per-model sampler defaults: what a model folder's `sampler.json` says, where each value came from, and how a chat's
settings are resolved from the layers. Torch-free (the CLI reads it before anything heavy).

Layers, later ones win:  tinychat's defaults (ChatSettings: tuned for the shipped model)
                         < the model's defaults (sampler.json in its folder)
                         < the session's recorded settings (continuing a chat)
                         < flags / `/set`.

sampler.json (written by `tinychat import` / `pull`; a user may edit it):

    {"settings": {"temperature": 0.2, "top_p": 0.9, "penalty": 1.0, ...},
     "from": {"temperature": "SmolLM2's model card (tinychat's table)", ...},
     "unused": {"top_k": 50}}

`settings` holds ChatSettings fields; `from` says where each came from (shown by `tinychat info`, F2 and `/set`);
`unused` keeps what the checkpoint recommends that tinychat's sampler has no knob for (top-k, min-p).

Where an import finds values, in order: the GGUF's `general.sampling.*` keys or the folder's generation_config.json
(the checkpoint's own), then tinychat's table for well-known families whose checkpoints say nothing, then tinychat's
base for imported models (IMPORTED below, measured on tests/perf/ten_questions.py)."""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .settings import ChatError, ChatSettings
from .errors import TinychatError

SAMPLER_FILE = "sampler.json"
TINYCHAT = "tinychat's default"        # the source of a value nothing else set

# GGUF general.sampling.* key -> ChatSettings field (the others go to "unused")
GGUF_KEYS = {"temp": "temperature", "top_p": "top_p", "penalty_repeat": "penalty", "penalty_last_n": "penalty_window"}
# generation_config.json key -> ChatSettings field
GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "repetition_penalty": "penalty"}
UNUSED_KEYS = ("top_k", "min_p")       # recommended by checkpoints, no knob in tinychat's sampler (top-p only)

# Families whose checkpoints carry no sampler but whose model card recommends one: (pattern over the model's names
# -- GGUF general.basename / general.name, the repo id, the folder or file name --, values, where they come from).
FAMILIES: list[tuple[re.Pattern, dict[str, Any], str]] = [
    (re.compile(r"smollm", re.I), {"temperature": 0.2, "top_p": 0.9}, "SmolLM2's model card (tinychat's table)"),
]

# Every imported (llama-family) model: no repetition penalty (what transformers and llama.cpp default to, and what
# such checkpoints are tuned and evaluated with); none of the shipped model's phrase bans across turns, which make a
# real model paraphrase the user's words and its own (SmolLM2-135M at temperature 0.7: "the sum of the numbers 1+1
# and 2+7" for "What is 12 + 7?"; the same score on the 10-question set with them or without); and room for a whole
# answer (256 tokens cut 2 of 30 replies, 1,024 none). The reply ban stays on: it stops loops within a reply.
# Measured with tests/perf/ten_questions.py (docs/benchmarks.md, "Sampler defaults").
IMPORTED: dict[str, Any] = {"penalty": 1.0, "ban": False, "no_parrot": False, "max_new": 1024}
IMPORTED_SOURCE = "tinychat's default for imported models"

FIELDS = tuple(f.name for f in dataclasses.fields(ChatSettings) if f.name != "system_prompt")


class SamplerFileError(TinychatError, ValueError):
    """A sampler.json tinychat cannot use; one line naming the file and what is wrong."""


@dataclass(frozen=True)
class ModelDefaults:
    """A model's sampler defaults: ChatSettings fields -> value, each with where it came from."""
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    unused: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"settings": self.values, "from": self.sources, "unused": self.unused}, indent=2) + "\n"

    def merged(self, values: dict[str, Any], source: str) -> "ModelDefaults":
        """These defaults with `values` filled in where none is set yet (the earlier layer wins)."""
        new = {k: v for k, v in values.items() if k not in self.values}
        return ModelDefaults({**self.values, **new}, {**self.sources, **{k: source for k in new}}, dict(self.unused))


def _checked(values: dict[str, Any], where: str) -> dict[str, Any]:
    """values limited to known fields, each valid as ChatSettings takes it (ints as ints); SamplerFileError else."""
    out = {}
    for k, v in values.items():
        if k not in FIELDS:
            raise SamplerFileError(f"{where}: unknown setting {k!r} (settings: {', '.join(FIELDS)})")
        cur = getattr(ChatSettings(), k)
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if isinstance(cur, bool):
            ok = isinstance(v, bool)
        elif k == "seed" or isinstance(cur, int):
            ok = (v is None and k == "seed") or (number and float(v).is_integer())
        else:
            ok = number
        if not ok:
            raise SamplerFileError(f"{where}: {k} = {v!r} is not a {type(cur).__name__}")
        out[k] = float(v) if isinstance(cur, float) else int(v) if isinstance(v, float) else v
    try:
        ChatSettings(**out)
    except ChatError as e:
        raise SamplerFileError(f"{where}: {e}") from None
    return out


def read(folder: str | Path) -> ModelDefaults:
    """A model folder's defaults: its sampler.json; for a model imported before sampler.json existed, what an import
    would write today from its name (the family table and the imported-model base); else none (the shipped model,
    any TinyAgentLM folder: tinychat's own values were tuned for it)."""
    folder = Path(folder)
    path = folder / SAMPLER_FILE
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SamplerFileError(f"{path}: unreadable ({' '.join(str(e).split())[:100]})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("settings", {}), dict):
            raise SamplerFileError(f"{path}: not a JSON object with a \"settings\" object")
        values = _checked(doc.get("settings", {}), str(path))
        src = doc.get("from") if isinstance(doc.get("from"), dict) else {}
        unused = doc.get("unused") if isinstance(doc.get("unused"), dict) else {}
        return ModelDefaults(values, {k: str(src.get(k) or f"the model's {SAMPLER_FILE}") for k in values}, unused)
    meta_path = folder / "import.json"           # importer/store.py's IMPORT_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            meta = {}
        hints = [folder.name, str(meta.get("source", "")) if isinstance(meta, dict) else ""]
        try:
            context = int(json.loads((folder / "config.json").read_text(encoding="utf-8"))["max_seq_len"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            context = None
        return derive({}, {}, hints, context=context)
    return ModelDefaults()


def derive(checkpoint: dict[str, Any], checkpoint_sources: dict[str, str], hints: list[str],
           unused: dict[str, Any] | None = None, context: int | None = None) -> ModelDefaults:
    """An imported model's defaults: the checkpoint's own values, then the family table (matched on hints: the
    model's names), then the imported-model base, its max-new at most a quarter of the model's context (a turn
    needs room for the prompt and the reply: `import --context 512` gets 128)."""
    d = ModelDefaults(dict(checkpoint), dict(checkpoint_sources), dict(unused or {}))
    text = " ".join(h for h in hints if h)
    for pattern, values, source in FAMILIES:
        if pattern.search(text):
            d = d.merged(values, source)
            break
    base = dict(IMPORTED)
    if context:
        base["max_new"] = max(1, min(base["max_new"], context // 4))
    return d.merged(base, IMPORTED_SOURCE)


def from_gguf_fields(fields: dict[str, Any]) -> tuple[dict, dict, dict]:
    """(values, sources, unused) from a GGUF's metadata {key: value}: its general.sampling.* keys."""
    values, sources, unused = {}, {}, {}
    for key, v in fields.items():
        if not key.startswith("general.sampling.") or isinstance(v, (list, str)):
            continue
        name = key[len("general.sampling."):]
        if name in GGUF_KEYS:
            # GGUF floats are float32: 0.3 reads 0.30000001192..., so six significant digits are kept
            values[GGUF_KEYS[name]] = int(v) if GGUF_KEYS[name] == "penalty_window" else float(f"{float(v):.6g}")
            sources[GGUF_KEYS[name]] = f"the GGUF's {key}"
        elif name in UNUSED_KEYS:
            unused[name] = float(f"{v:.6g}") if isinstance(v, float) else v
    return _valid_part(values, sources, "the GGUF's general.sampling"), sources, unused


def from_generation_config(gen: Any) -> tuple[dict, dict, dict]:
    """(values, sources, unused) from a generation_config.json's content (temperature, top_p, repetition_penalty;
    top_k kept as unused). do_sample is not read: its false is transformers' default, not a recommendation."""
    values, sources, unused = {}, {}, {}
    if not isinstance(gen, dict):
        return values, sources, unused
    for key, name in GENERATION_KEYS.items():
        v = gen.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values[name] = float(v)
            sources[name] = f"generation_config.json's {key}"
    for key in UNUSED_KEYS:
        if isinstance(gen.get(key), (int, float)) and not isinstance(gen.get(key), bool):
            unused[key] = gen[key]
    return _valid_part(values, sources, "generation_config.json"), sources, unused


def _valid_part(values: dict, sources: dict, where: str) -> dict:
    """The values ChatSettings accepts, one by one (a checkpoint's temperature 1e-5 or top_p 0 is clamped into range,
    so one odd value does not lose the others)."""
    out = {}
    for k, v in values.items():
        lo, hi = ChatSettings.LIMITS.get(k, (None, None))
        if lo is not None:
            v = min(max(v, lo), hi)
        out[k] = v
    return out


def resolve(model: ModelDefaults, session: dict[str, Any] | None = None,
            overrides: dict[str, Any] | None = None, override_source: str = "flag",
            base: ChatSettings | None = None) -> tuple[ChatSettings, dict[str, str]]:
    """(settings, {field: where its value came from}): tinychat's (or `base`), then the model's defaults, then the
    session's recorded settings, then the overrides (flags, /set)."""
    base = base or ChatSettings()
    values = dataclasses.asdict(base)
    sources = {k: TINYCHAT for k in values}
    for layer, label in ((model.values, None), (session or {}, "the session"), (overrides or {}, override_source)):
        for k, v in layer.items():
            if k in values:
                values[k] = v
                sources[k] = label or model.sources.get(k, "the model")
    try:
        return ChatSettings(**values), sources
    except (ChatError, TypeError) as e:
        raise ChatError(f"unusable settings ({e})") from None
