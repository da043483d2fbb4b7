"""Loading what a chat runs on, below the CLI and the app: the model (a checkpoint folder, a named size with random
weights, or the shipped model), its tokenizer, the device, and a Chat for a new or saved session.

Torch-light: torch, the model and the chat runtime are imported inside the functions, so importing this module is
cheap (the CLI's --help, the app's window before the model loads). Bad input raises LoadError, one line fit for the
user; the CLI turns it into its one-line error and exit 2."""
from __future__ import annotations


import dataclasses
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from .choices import DEVICES, QUANT_CHOICES, QUANT_MODES, SIZES, SMALL_INT4
from .errors import TinychatError


class LoadError(TinychatError, ValueError):
    """A model, device or choice that cannot be used; the message is one line, fit for the user."""


def check_threads(n: int | None) -> int | None:
    """--threads: None (as torch has it), or a count from 1 to a few times the cores (a count of 100,000 would
    have OpenMP start that many threads). LoadError otherwise."""
    if n is None:
        return None
    most = max(64, 4 * (os.cpu_count() or 1))
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= most:
        raise LoadError(f"--threads must be between 1 and {most} (got {n})")
    return n


def check_choice(name: str, value: str, choices) -> str:
    """value, when it is one of choices; else LoadError naming the flag."""
    if value not in choices:
        raise LoadError(f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


def default_model_path() -> Path | None:
    """The model shipped with tinychat: tinychat/assets (installed) or assets/ beside the package (a checkout)."""
    here = Path(__file__).resolve().parent
    for p in (here / "assets", here.parent / "assets"):
        if (p / "config.json").is_file():
            return p
    return None


def model_path(model: str | Path | None) -> Path | None:
    """--model as given: an existing path wins; else the name of a model imported with `tinychat import`
    (importer/store.py); else a Hugging Face repo id, ORG/NAME[:QUANT], that `tinychat pull` imported (the one model
    pulled from it). A bare name that is none of these is a LoadError that says where models come from, a repo id
    never pulled one that says how to pull it; another path that does not exist comes back unchanged, so the
    loaders' own "no such model folder" error speaks."""
    from .importer.store import close_names, model_path as imported, pulled_as, resolve
    path = resolve(model)
    name = str(model)
    if path is None or path.exists():
        return path
    if "/" not in name and os.sep not in name:
        near = close_names(name)
        hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
        raise LoadError(f"no model folder or imported model named {name!r} ({hint}`tinychat models` lists the "
                        f"imported ones; `tinychat pull ORG/NAME` or `tinychat import SRC` brings one)")
    from .hub.ref import PullError, parse_ref
    try:
        ref = parse_ref(name)
    except PullError:
        return path
    if ref.revision is None and not name.startswith(("./", "../")):
        names = pulled_as(ref.repo, ref.quant)
        if len(names) == 1:
            return imported(names[0])
        if names:
            raise LoadError(f"{name}: pulled as {', '.join(names)}; give one of them to --model (or ORG/NAME:QUANT)")
        raise LoadError(f"{name}: no such model folder, nor a model pulled from that Hugging Face repo "
                        f"(`tinychat pull {name}` downloads and imports it)")
    return path


def load_model_for(model: Path | None, config: str | None, seed: int = 0, quant: str = "none"):
    """(model, description): a checkpoint folder, a named size with random weights, or the shipped model. quant:
    the mode it is about to be quantized to (int8 / bf16: a folder's Linear weights stay as stored until then)."""
    import torch

    from .model import TinyAgentLM, config_for
    if model is not None and config is not None:
        raise LoadError("give --model or --config, not both")
    if config is not None:
        check_choice("--config", config, tuple(SIZES))
        torch.manual_seed(seed)
        with torch.no_grad():
            m = TinyAgentLM(config_for(config))
        return m.eval(), f"{config} (random weights)"
    path = model if model is not None else default_model_path()
    if path is None:
        raise LoadError("no model given and no default model is shipped in this install; "
                        "use --model PATH (a folder with config.json and model.safetensors)")
    return load_folder(path, quant), str(path)


def load_folder(path: Path, quant: str = "none", check_finite: bool = True):
    """The TinyAgentLM of a model folder: a stored-quantized one (quant_files.py: its packed Linears mapped as they
    lie, whatever quant says; the plan then runs its stored mode) or a full-precision one (from_pretrained; quant
    int8 / int4 / bf16: the Linear weights stay as stored until quantized)."""
    from .model import TinyAgentLM
    from .norm_gains import load_gains
    from .quant_files import load_quantized, stored_mode
    if stored_mode(Path(path)) is not None:
        return load_quantized(Path(path), check_finite=check_finite)
    model = TinyAgentLM.from_pretrained(path, stored_linears=quant in ("int8", "int4", "bf16"),
                                        check_finite=check_finite)
    load_gains(model, Path(path))           # an import's norm gains, for quantize_cpu (norm_gains.py)
    return model


def resolve_device(device: str, resolve: bool = True) -> str:
    """cpu or cuda; "auto" stays "auto" without `resolve` (the app resolves it on its loading worker, so the window
    does not wait for torch)."""
    check_choice("--device", device, DEVICES)
    if device == "cpu" or (device == "auto" and not resolve):
        return device
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise LoadError("--device cuda: no CUDA GPU is available here")
    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_quant(device: str) -> tuple[str, str]:
    """What `--quant auto` runs on `device` (cpu or cuda), and why: the int8 fast step on a CPU where the native
    kernels build (and pass their self-test), the captured graph in full precision on a GPU, fp32 otherwise (the
    eager loop: the reference path). Builds the kernels on first use (cached)."""
    if device == "cuda":
        return "none", "a GPU: full precision through the captured graph"
    from .engine import native
    if native.load() is not None:
        return "int8", f"the native int8 kernels run here ({native.kernel_path()})"
    return "none", f"no native int8 kernels here ({native.why_not or 'off'}): fp32, the eager loop"


def resolve_quant(quant: str, device: str, sess=None) -> tuple[str, str | None]:
    """(mode, why auto chose it) for a chat's --quant on a resolved device; why is None for a mode given by hand.
    auto continuing a session `sess` keeps the mode it was recorded with (its turns, snapshot and replay are that
    mode's) when that mode runs on this device; else auto_quant."""
    check_choice("--quant", quant, QUANT_CHOICES)
    if quant != "auto":
        return quant, None
    if sess is not None and sess.quant in QUANT_MODES and (device == "cpu" or sess.quant == "none"):
        return sess.quant, "the mode the session was recorded with"
    return auto_quant(device)


@dataclass
class Runtime:
    """A loaded chat model: the model, its tokenizer, the name sessions record and its identity hash."""
    model: Any
    tokenizer: Any
    name: str
    identity: str
    defaults: Any = None        # sampler_defaults.ModelDefaults: the model's sampler.json (None: none)

    def __iter__(self):             # (model, tokenizer, name, identity), as load_runtime returned them before
        return iter((self.model, self.tokenizer, self.name, self.identity))


def load_runtime(model: Path | None, quant: str = "none") -> Runtime:
    """The model and tokenizer for chatting: a checkpoint folder with its tokenizer.json (None: the shipped one).
    quant: the mode the chats will run (int8 / bf16: the Linear weights stay as stored until quantized)."""
    from .identity import cached_identity, model_identity
    from .model_config import TOKENIZER_FILE
    from .tokenizer import Tokenizer
    path = model if model is not None else default_model_path()
    if path is None:
        raise LoadError("no model given and no default model is shipped in this install; "
                        "use --model PATH (a folder with config.json, model.safetensors, tokenizer.json)")
    lock = hold_model(Path(path))
    # NaN / Inf weights are refused by the identity's hashing (one read of the weights, once per file version)
    m = load_folder(Path(path), quant, check_finite=False)
    m._tinychat_lock = lock                 # held (shared) for as long as the model is: rm and import wait for it
    if not (Path(path) / TOKENIZER_FILE).is_file():
        raise LoadError(f"{path}: no {TOKENIZER_FILE} (a chat model folder needs its tokenizer)")
    tok = Tokenizer.from_file(Path(path) / TOKENIZER_FILE)
    if tok.vocab_size > m.cfg.vocab_size:
        raise LoadError(f"{path}: tokenizer has {tok.vocab_size} tokens, the model only {m.cfg.vocab_size}")
    shipped = default_model_path()
    is_default = model is None or (shipped is not None and Path(path).resolve() == shipped.resolve())
    name = "default" if is_default else Path(path).resolve().name
    try:
        identity = cached_identity(Path(path), lambda: model_identity(m))
    except ValueError as e:             # CheckpointError: a tensor holding NaN / Inf
        raise LoadError(f"{Path(path) / 'model.safetensors'}: {e}") from None
    return Runtime(m, tok, name, identity, model_defaults(Path(path)))


def model_defaults(path: Path):
    """The sampler defaults of the model folder at path (sampler_defaults.read); LoadError for a bad sampler.json."""
    from .sampler_defaults import SamplerFileError, read
    try:
        return read(path)
    except SamplerFileError as e:
        raise LoadError(str(e)) from None


def latest_session() -> str | None:
    """The id of the most recently updated saved session (what -c continues), or None when there is none."""
    from .sessions import session as session_files
    infos = session_files.list_sessions()
    return infos[0].id if infos else None


def hold_model(path: Path):
    """The shared lock of the imported model at `path` (importer/lock.py: `models rm` and `import` of its name are
    refused while it is held), or None for a folder outside the models folder (the shipped model, a checkpoint)."""
    from . import paths
    from .importer.lock import ModelBusy, acquire
    folder = paths.models_dir()
    try:
        inside = path.resolve().parent == folder.resolve()
    except OSError:
        return None
    if not inside:
        return None
    try:
        return acquire(folder, path.resolve().name, shared=True)
    except ModelBusy as e:
        raise LoadError(str(e)) from None
    except OSError:                         # a models folder that cannot hold a lock file: nothing can write it either
        return None


def model_for_session(model: Path | None, ref: str) -> Path | None:
    """--model for continuing or replaying the saved session ref: the one given; else the imported model the session
    names (`tinychat import` keeps it under the models folder by that name) when there is one; else None (the
    shipped model). A ref that does not load leaves it to the caller's own load to report."""
    if model is not None:
        return model
    from .sessions import session as session_files
    try:
        sess = session_files.load(ref)
    except Exception:  # noqa: BLE001  the caller's session_files.load reports it in its one line
        return None
    return session_model(sess)


def session_model(sess) -> Path | None:
    """The imported model a loaded session names, when there is one under the models folder; else None (the
    shipped model, or a model that is not here: the replay then says the session was recorded with another)."""
    return named_model(sess.model.get("name") or "")


def named_model(name: str) -> Path | None:
    """The imported model called `name` (a folder under the models folder), or None ("default", the shipped model's
    name in sessions, is not an imported one)."""
    from . import paths
    if not name or name == "default" or "/" in name or name.startswith("."):
        return None
    p = paths.models_dir() / name
    return p if (p / "config.json").is_file() else None


def open_chat(rt: Runtime, quant: str, device: str, settings=None, overrides: Mapping[str, Any] | None = None,
              session_ref: str | None = None, options=None, quant_why: str | None = None, autosave: bool = True):
    """A Chat on rt: a new one, or the saved session session_ref (an id or a path, as tinychat.sessions.session.load reads
    it) continued. Settings by layers (sampler_defaults.resolve; chat.sources says where each came from): tinychat's
    defaults, the model's (rt.defaults: its sampler.json), the session's recorded ones, then `overrides` (flags; all
    but the system prompt for a session, which belongs to its recorded history). `settings`, when given for a new
    chat, replaces the first two layers (a caller's exact settings). options: EngineOptions (None: defaults).
    A new chat whose overrides name no system prompt starts with the checkpoint's own where its chat template has one
    (an imported model's: SmolLM2's "You are a helpful AI assistant named SmolLM, ..."), as the template would.
    quant: a resolved mode (resolve_quant); quant_why: why `--quant auto` chose it (the chat's status says so).
    autosave False: nothing is written unless asked (--no-save)."""
    from .sessions import session as session_files
    from .chat.runtime import Chat, check_recorded, settings_from_session
    from .sampler_defaults import ModelDefaults, resolve
    from .plan import decide
    check_choice("--quant", quant, QUANT_MODES)
    kw = dict(model_name=rt.name, model_hash=rt.identity, autosave=autosave)
    model = (rt.defaults if settings is None else None) or ModelDefaults()
    overrides = dict(overrides or {})
    small = small_int4_note(rt.model, quant, quant_why)    # counted before decide() quantizes the model
    if session_ref is None:
        st, sources = resolve(model, None, overrides, base=settings)
        own = rt.tokenizer.chat.default_system
        if own is not None and "system_prompt" not in overrides:
            st, sources["system_prompt"] = replace(st, system_prompt=own), "the chat template"
        plan = decide(rt.model, quant, device, options, quant_why=quant_why)    # the model quantized to its mode
        chat = Chat(rt.model, rt.tokenizer, st, plan=plan, **kw)
        try:
            chat.check_max_new(chat.settings.max_new)   # --max-new that no turn could hold: say so now
        except BaseException:
            chat.close()
            raise
    else:
        sess = session_files.load(session_ref)
        recorded = dataclasses.asdict(settings_from_session(sess))     # checked, with the session's id in any error
        recorded = {k: v for k, v in recorded.items() if k in (sess.settings or {}) or k == "system_prompt"}
        overrides.pop("system_prompt", None)
        st, sources = resolve(model, recorded, overrides)
        check_recorded(sess, rt.model, rt.tokenizer, rt.name, rt.identity)    # another model's: before quantizing
        plan = decide(rt.model, quant, device, options, quant_why=quant_why)
        chat = Chat.restore(sess, rt.model, rt.tokenizer, settings=st, max_len=sess.model.get("max_len"), plan=plan,
                            **kw)
        if "max_new" in overrides:
            try:
                chat.check_max_new(chat.settings.max_new)
            except BaseException:
                chat.close()
                raise
    chat.sources = sources
    chat.notice = "; ".join(filter(None, [chat.notice, small])) or None
    return chat


def small_int4_note(model, quant: str, quant_why: str | None) -> str | None:
    """One line when `--quant int4` was asked by hand of a model under SMALL_INT4 parameters (SmolLM2-135M: top-1
    agreement with fp32 0.64, greedy answers that drift; int8 0.92), else None."""
    if quant != "int4" or quant_why is not None:
        return None
    from .quant_files import param_counts
    if param_counts(model)[0] >= SMALL_INT4:
        return None
    return (f"4-bit weights cost a model this small (under {SMALL_INT4 // 10**6}M parameters) much of its quality; "
            "--quant int8 keeps it")


def open_replay_chat(rt: Runtime, sess, device: str, options=None):
    """A fresh Chat to replay the recorded session `sess` on: its quant mode, system prompt and context length,
    autosave off (a replay never writes the session)."""
    from .chat.runtime import Chat, ChatSettings
    from .plan import decide
    plan = decide(rt.model, sess.quant, device, options)
    return Chat(rt.model, rt.tokenizer, ChatSettings(system_prompt=sess.system_prompt), plan=plan,
                model_name=rt.name, model_hash=rt.identity, autosave=False, max_len=sess.model.get("max_len"))
