"""Tokenizer wrapper and the chat templates (ChatML; Llama 3's header tokens for imported models).

Wraps a Hugging Face `tokenizers.Tokenizer` (a `tokenizer.json`) and adds what the chat runtime needs:

- ChatML framing built from token ids, never by parsing special-token strings out of text, so a user who types
  "<|im_end|>" gets those characters, not the stop token;
- per-message id rendering, so a runtime can append only the new turn's tokens to its KV cache and still hold
  exactly `format_messages(history)`;
- `StreamDecoder`, an incremental detokenizer for live output (byte-level BPE tokens can end in the middle of a
  multi-byte UTF-8 character; it holds such text back until the character is complete);
- per-token display strings and the canonical-id map used by the model's Engram lookup;
- `train_bpe`, a byte-level BPE trainer for tests and the training pipeline.

No torch here: the tokenizer is used by the UI and by tooling that never loads a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from .jsonfields import one_line
from .errors import TinychatError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
# Order fixes their ids in a freshly trained tokenizer: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ROLES = ("system", "user", "assistant")


class TokenizerError(TinychatError, ValueError):
    """A tokenizer.json that is missing, unreadable, or unusable for ChatML. The message is one line."""


@dataclass(frozen=True)
class ChatFormat:
    """How a message is framed, as text with special tokens: header (with {role}) + content + end. The first token
    of `end` is the stop token. `bos` starts a system message (Llama 3's <|begin_of_text|>: a context begins with
    its system message). default_system: the checkpoint's own system prompt, used when the user gives none (an
    imported model's chat template names it; None: the app's default)."""
    name: str
    header: str
    end: str
    bos: str | None = None
    default_system: str | None = None


CHAT_FORMATS = {
    "chatml": ChatFormat("chatml", IM_START + "{role}\n", IM_END + "\n"),
    "llama3": ChatFormat("llama3", "<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>",
                         "<|begin_of_text|>"),
}
CHAT_FORMAT_FILE = "chat_format.json"   # beside tokenizer.json in an imported model's folder: {"format": NAME, ...}


def chat_format_for(tokenizer_path: Path) -> ChatFormat:
    """The chat format of the model folder holding tokenizer_path: its chat_format.json, else ChatML."""
    f = Path(tokenizer_path).parent / CHAT_FORMAT_FILE
    if not f.is_file():
        return CHAT_FORMATS["chatml"]
    try:
        spec = json.loads(f.read_text(encoding="utf-8"))
        name = spec.get("format")
    except (OSError, ValueError, AttributeError) as e:
        raise TokenizerError(f"{f}: unreadable chat format ({one_line(e)[:100]})") from None
    if name not in CHAT_FORMATS:
        raise TokenizerError(f"{f}: unknown chat format {name!r} (known: {', '.join(CHAT_FORMATS)})")
    default = spec.get("default_system")
    if default is not None and not isinstance(default, str):
        raise TokenizerError(f"{f}: default_system must be a string")
    return dataclasses.replace(CHAT_FORMATS[name], default_system=default or None)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable char standing for each byte -> that byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def _uses_byte_level_decoder(spec: Mapping | None) -> bool:
    if not spec:
        return False
    if spec.get("type") == "ByteLevel":
        return True
    return any(_uses_byte_level_decoder(d) for d in spec.get("decoders") or ())


class Tokenizer:
    """A chat tokenizer (ChatML by default). Build with `from_file`, `from_str` or `train_bpe`.

    `im_end` is the stop token of the chat format (`<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3); `im_start`
    is the tokenizer's `<|im_start|>` id (None when it has none)."""

    def __init__(self, hf: HFTokenizer, *, source: str = "<tokenizer>", chat: ChatFormat | None = None):
        self._hf = hf
        self.source = source  # shown in error messages: a path, or "<tokenizer>" for in-memory ones
        self.chat = chat = chat or CHAT_FORMATS["chatml"]
        ids = {tok: hf.token_to_id(tok) for tok in SPECIAL_TOKENS}
        if chat.name == "chatml":
            missing = [tok for tok in (IM_START, IM_END) if ids[tok] is None]
            if missing:
                raise TokenizerError(f"{source}: tokenizer lacks the ChatML special token(s) {', '.join(missing)}")
        else:
            need = re.findall(r"<\|[^|]+\|>", chat.header + chat.end + (chat.bos or ""))
            missing = [tok for tok in dict.fromkeys(need) if hf.token_to_id(tok) is None]
            if missing:
                raise TokenizerError(f"{source}: tokenizer lacks the {chat.name} special token(s) {', '.join(missing)}")
        stop = ids[IM_END] if chat.name == "chatml" else hf.token_to_id(re.match(r"<\|[^|]+\|>", chat.end).group(0))
        self.im_start: int | None = ids[IM_START]
        self.im_end: int = stop
        self.endoftext: int | None = ids[ENDOFTEXT]
        # Special tokens by literal text, longest first so that the split regex prefers the longest match.
        added = {t.content: i for i, t in hf.get_added_tokens_decoder().items() if t.special}
        added.update({tok: i for tok, i in ids.items() if i is not None})
        self._specials = dict(sorted(added.items(), key=lambda kv: -len(kv[0])))
        self._special_re = re.compile("(" + "|".join(map(re.escape, self._specials)) + ")")
        self._newline = self.encode("\n")

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """tokenizer.json; the chat format from a chat_format.json beside it (an imported model), else ChatML."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TokenizerError(f"{path}: tokenizer file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerError(f"{path}: cannot read tokenizer file ({one_line(e)})") from None
        return cls.from_str(text, source=str(path), chat=chat_format_for(path))

    @classmethod
    def from_str(cls, text: str, *, source: str = "<tokenizer>", chat: ChatFormat | None = None) -> Tokenizer:
        try:
            json.loads(text)
        except (ValueError, RecursionError) as e:
            raise TokenizerError(f"{source}: tokenizer file is not valid JSON ({one_line(e)})") from None
        try:
            hf = HFTokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001  the Rust side raises plain Exception for schema errors
            raise TokenizerError(f"{source}: not a Hugging Face tokenizer.json ({one_line(e)[:200]})") from None
        return cls(hf, source=source, chat=chat)

    def to_str(self, pretty: bool = False) -> str:
        return self._hf.to_str(pretty)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str(pretty=True), encoding="utf-8")

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped `tokenizers.Tokenizer` (treat as read-only)."""
        return self._hf

    @cached_property
    def sha256(self) -> str:
        """Identity of the token<->id mapping and pipeline: sha256 of the compact serialization."""
        return hashlib.sha256(self.to_str(pretty=False).encode("utf-8")).hexdigest()

    # -- basics ---------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        """The stop token: `<|im_end|>` ends every assistant turn."""
        return self.im_end

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self._specials.values())

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        """Text -> ids, nothing added. Special-token strings in `text` stay plain text unless `allow_special`."""
        if not allow_special:
            return self._encode_plain(text)
        ids: list[int] = []
        for i, piece in enumerate(self._special_re.split(text)):
            if i % 2:  # odd pieces are the separators the regex captured: special tokens
                ids.append(self._specials[piece])
            elif piece:
                ids.extend(self._encode_plain(piece))
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        # The Rust side matches special-token strings inside the text before the model runs. Text that holds
        # none (nearly all of it) takes the fast path; the rest goes through a copy with that matching off.
        if not text:
            return []
        if not self._special_re.search(text):
            return self._hf.encode(text, add_special_tokens=False).ids
        return self._hf_literal.encode(text, add_special_tokens=False).ids

    @cached_property
    def _hf_literal(self) -> HFTokenizer:
        # `encode_special_tokens` is a mutable flag on the Rust object: a private copy rather than toggling it
        # on the shared one keeps concurrent encodes (UI thread + decode worker) safe.
        hf = HFTokenizer.from_str(self._hf.to_str())
        hf.encode_special_tokens = True
        return hf

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, token_id: int) -> str | None:
        """The raw vocabulary entry (byte-level tokens show their byte alphabet, e.g. 'Ġthe')."""
        return self._hf.id_to_token(token_id)

    # -- ChatML ---------------------------------------------------------------------------------------------
    # Context layout, as one string (ChatML):
    #   <|im_start|>system\n{sys}<|im_end|>\n<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n
    # Every message renders independently as  header_ids(role) + encode(content) + end_ids(),  so a context
    # is the plain concatenation of its messages' ids (plus the generation prompt). An assistant turn in the
    # cache is  generation_prompt_ids() + <sampled ids> + end_ids(): the same shape, with sampled ids in place
    # of encode(content), which is why session files record token ids rather than re-encoding text.

    def header_ids(self, role: str) -> list[int]:
        """`<|im_start|>{role}\\n` (other formats: their header; Llama 3's system header starts with its BOS)"""
        _check_role(role)
        if self.chat.name == "chatml":
            return [self.im_start, *self.encode(role + "\n")]
        bos = self.chat.bos if role == "system" and self.chat.bos else ""
        return self.encode(bos + self.chat.header.format(role=role), allow_special=True)

    def end_ids(self) -> list[int]:
        """`<|im_end|>\\n`: closes a message (the runtime appends it when a turn is cut off, too). Other formats:
        their end text, which starts with the stop token."""
        if self.chat.name == "chatml":
            return [self.im_end, *self._newline]
        return self.encode(self.chat.end, allow_special=True)

    def message_ids(self, role: str, content: str) -> list[int]:
        return [*self.header_ids(role), *self.encode(content), *self.end_ids()]

    def generation_prompt_ids(self) -> list[int]:
        """`<|im_start|>assistant\\n`: what the model continues from."""
        return self.header_ids("assistant")

    def content_ids(self, role: str, token_ids: Sequence[int]) -> list[int]:
        """A recorded message's content ids: its token_ids without the ChatML frame (`<|im_start|>{role}\\n` before,
        `<|im_end|>\\n` after). For a reply: the sampled tokens, the stop token excluded."""
        return list(token_ids[len(self.header_ids(role)):len(token_ids) - len(self.end_ids())])

    def format_messages(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """[{"role", "content"}, ...] -> ChatML ids, ending in the generation prompt when asked."""
        ids: list[int] = []
        for i, m in enumerate(messages):
            try:
                role, content = m["role"], m["content"]
            except (KeyError, TypeError):
                raise ValueError(f"message {i} must be a mapping with 'role' and 'content'") from None
            if not isinstance(content, str):
                raise ValueError(f"message {i}: content must be a string, got {type(content).__name__}")
            ids += self.message_ids(role, content)
        if add_generation_prompt:
            ids += self.generation_prompt_ids()
        return ids

    @staticmethod
    def format_text(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The same context as a string (for display and tests; the runtime uses ids)."""
        text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
        return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")

    @cached_property
    def max_token_bytes(self) -> int:
        """An upper bound of the bytes (and so the characters) one token stands for: its longest vocabulary entry in
        UTF-8 (a byte-level entry is at least as long as its bytes, a metaspace "▁" longer than its space). A text of
        more than context x this characters cannot fit the context, which can be told before tokenizing it."""
        return max((len(t.encode("utf-8")) for t in self._hf.get_vocab()), default=1)

    # -- per-token views ------------------------------------------------------------------------------------

    @cached_property
    def _token_bytes(self) -> list[bytes] | None:
        """Each id's exact bytes when the tokenizer is byte-level (None otherwise)."""
        spec = json.loads(self._hf.to_str())
        if not _uses_byte_level_decoder(spec.get("decoder")):
            return None
        table = _byte_decoder()
        added = {i: t.content for i, t in self._hf.get_added_tokens_decoder().items()}
        out: list[bytes] = []
        for i in range(self.vocab_size):
            if i in added:
                out.append(added[i].encode("utf-8"))
                continue
            tok = self._hf.id_to_token(i)
            if tok is None or any(c not in table for c in tok):
                return None  # not the byte-level alphabet after all: fall back to decoding
            out.append(bytes(table[c] for c in tok))
        return out

    def token_bytes(self, tid: int) -> bytes:
        """The exact bytes token `tid` stands for: a byte-level token that holds part of a UTF-8 character gives those
        bytes (decoding it alone gives U+FFFD); other tokenizers give their decoded text's UTF-8."""
        raw = self._token_bytes
        if raw is not None and 0 <= tid < len(raw):
            return raw[tid]
        return self._hf.decode([tid], skip_special_tokens=False).encode("utf-8")

    def token_strings(self) -> list[str]:
        """Display text of every id (index = id).

        Byte-level tokens that hold part of a UTF-8 character show those bytes as `\\xNN` escapes, so distinct
        partial tokens stay distinct (decoding them alone would give the same U+FFFD for all of them).
        """
        raw = self._token_bytes
        if raw is not None:
            return [b.decode("utf-8", errors="backslashreplace") for b in raw]
        return [self._hf.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)]

    def canonical_ids(self) -> list[int]:
        """Canonical id of every token: tokens equal after NFKC + lowercase + stripping one leading space share
        one id, the smallest token id of the class. (V,) list; feeds the model's `cid_map` for Engram."""
        first: dict[str, int] = {}
        out = []
        for i, s in enumerate(self.token_strings()):
            key = canonical_form(s)
            out.append(first.setdefault(key, i))
        return out


def canonical_form(token_text: str) -> str:
    text = unicodedata.normalize("NFKC", token_text).lower()
    return text[1:] if text.startswith(" ") else text


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} (expected one of {', '.join(ROLES)})")


class StreamDecoder:
    """Incremental detokenizer: push ids as they are sampled, get back only newly completed text.

    Keeps a short window of ids: the last emitted ones (decoding context, which non-byte-level decoders need to
    place spaces) and the pending ones. Each push decodes the window and emits what extends past the context's
    text, unless that ends in U+FFFD: an incomplete UTF-8 character, held back until a later token completes
    it. So the pieces never split a character and, for byte-level tokenizers, concatenate to exactly
    `decode(all ids)`. (A literal U+FFFD in the output is held back one token, or until `flush`.)
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []  # window: ids[:self._read] already emitted (context), the rest pending
        self._read = 0
        self._emitted = ""  # decode(ids[:self._read])

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if len(text) <= len(self._emitted) or text.endswith("\ufffd"):
            return ""
        # Slide the window: the ids just emitted become the next push's decoding context.
        new = text[len(self._emitted):]
        del self._ids[: self._read]
        self._read, self._emitted = len(self._ids), self._decode(self._ids)
        return new

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character comes out as U+FFFD); then reset."""
        text = self._decode(self._ids)
        new = text[len(self._emitted):] if len(text) > len(self._emitted) else ""
        self._ids, self._read, self._emitted = [], 0, ""
        return new


def train_bpe(
    texts: Iterable[str], vocab_size: int, path: str | Path | None = None, *, min_frequency: int = 2
) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 pre-tokenization) with the ChatML specials as ids 0, 1, 2.

    `vocab_size` is an upper bound that counts the 256 byte tokens and the 3 specials (a small corpus may
    yield fewer merges). Every byte is a token, so nothing ever encodes to <unk>. Saves to `path` when given.
    """
    floor = 256 + len(SPECIAL_TOKENS)
    if vocab_size < floor:
        raise TokenizerError(f"vocab_size must be at least {floor} (256 bytes + 3 specials), got {vocab_size}")
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    tok = Tokenizer(hf, source=str(path) if path else "<trained>")
    if path is not None:
        tok.save(path)
    return tok
