"""What `tinychat pull` is asked for and which GGUF file answers it. No huggingface_hub here (`tinychat import` asks
whether its argument is a repo id without loading the client).

    parse_ref("bartowski/SmolLM2-360M-Instruct-GGUF:Q4_K_M@main") -> RepoRef(repo, quant="Q4_K_M", revision="main")
    gguf_choices({path: size}) -> [GgufChoice], best first;  pick_quant(choices, "q8_0") -> GgufChoice

A GGUF repo's files are grouped by the quant type their names carry (`...-Q4_K_M.gguf`, `....q8_0.gguf`, a folder
`Q4_K_M/`), as llama.cpp's `-hf user/repo:quant` matches them (case-insensitive). The default is Q8_0 (within 0.1 %
of the original weights, and tinychat dequantizes to float32 anyway), else the type closest to it in bits per weight
(the larger on a tie)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import PullError

# bits per weight of llama.cpp's types (its quantize --help table; K-quant mixes as their typical average)
QUANT_BITS = {
    "F32": 32.0, "BF16": 16.0, "F16": 16.0, "Q8_0": 8.5, "Q8_K_XL": 8.5, "Q6_K": 6.56, "Q6_K_L": 6.6, "Q6_K_XL": 6.6,
    "Q5_1": 6.0, "Q5_K_L": 5.8, "Q5_K_M": 5.69, "Q5_K_S": 5.54, "Q5_0": 5.5, "Q5_K_XL": 5.7, "Q4_1": 5.0,
    "Q4_K_L": 5.0, "Q4_K_M": 4.89, "Q4_K_XL": 4.9, "Q4_K_S": 4.58, "Q4_0": 4.5, "IQ4_NL": 4.5, "IQ4_XS": 4.25,
    "Q3_K_XL": 4.3, "Q3_K_L": 4.27, "Q3_K_M": 3.91, "IQ3_M": 3.66, "Q3_K_S": 3.5, "IQ3_S": 3.44, "IQ3_XS": 3.3,
    "IQ3_XXS": 3.06, "Q2_K_L": 3.0, "Q2_K": 2.96, "Q2_K_XL": 3.0, "IQ2_M": 2.7, "IQ2_S": 2.5, "IQ2_XS": 2.31,
    "TQ2_0": 2.06, "IQ2_XXS": 2.06, "IQ1_M": 1.75, "TQ1_0": 1.69, "IQ1_S": 1.56,
}
DEFAULT_QUANT = "Q8_0"
_ALIASES = {"FP16": "F16", "FP32": "F32"}
_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[0-9A-Z]+)*|TQ[12]_0|BF16|FP16|FP32|F16|F32)(?![A-Za-z0-9])",
                    re.I)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "https://hf.co/", "huggingface.co/", "hf.co/")


@dataclass(frozen=True)
class RepoRef:
    repo: str
    quant: str | None = None        # as typed (matched case-insensitively)
    revision: str | None = None     # None: the default branch

    def __str__(self) -> str:
        return self.repo + (f":{self.quant}" if self.quant else "") + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class GgufChoice:
    quant: str                      # "Q8_0", or the file name where the name carries no type
    files: list[str] = field(default_factory=list)
    size: int = 0

    @property
    def split(self) -> bool:
        return len(self.files) > 1

    @property
    def bits(self) -> float | None:
        return QUANT_BITS.get(self.quant)


def is_repo_id(text: str) -> bool:
    """Whether text has the shape of a Hugging Face repo id (namespace/name, optional :QUANT and @REVISION)."""
    try:
        parse_ref(text)
    except PullError:
        return False
    return True


def parse_ref(text: str) -> RepoRef:
    """REPO[:QUANT][@REVISION] (an hf.co/ or https://huggingface.co/ prefix is dropped); PullError when it is not."""
    s = (text or "").strip()
    for p in _PREFIXES:
        if s.lower().startswith(p):
            s = s[len(p):]
            break
    repo, at, revision = s.partition("@")
    repo, colon, quant = repo.partition(":")
    repo = repo.strip("/")
    if (at and not revision) or (colon and not quant) or not _REPO.match(repo) or "--" in repo or ".." in repo \
            or repo.endswith((".", "-")):
        raise PullError(f"{text!r} is not a Hugging Face model: give it as ORG/NAME[:QUANT][@REVISION] "
                        f"(e.g. HuggingFaceTB/SmolLM2-360M-Instruct)")
    if revision and (not re.fullmatch(r"[\w.-]+(/[\w.-]+)*", revision) or ".." in revision.split("/")):
        raise PullError(f"{text!r}: bad revision {revision!r} (a branch, tag or commit: main, v1.0, refs/pr/1)")
    if quant and not re.fullmatch(r"[\w.-]{1,64}", quant):
        raise PullError(f"{text!r}: bad quant {quant!r} (e.g. Q8_0, Q4_K_M)")
    return RepoRef(repo, quant or None, revision or None)


def quant_of(path: str) -> str | None:
    """The quant type a GGUF file's path names (the last one in it), upper-cased; None when it names none."""
    found = _QUANT.findall(_SPLIT.sub(".gguf", path))
    if not found:
        return None
    q = found[-1].upper()
    return _ALIASES.get(q, q)


def gguf_files(sizes: dict[str, int]) -> dict[str, int]:
    """The model GGUFs among a repo's files (vision projectors, `mmproj-*`, left out)."""
    return {p: s for p, s in sizes.items() if p.lower().endswith(".gguf") and "mmproj" not in p.lower()}


def gguf_choices(sizes: dict[str, int]) -> list[GgufChoice]:
    """A repo's GGUF files ({path: size}) grouped by quant type (a split file's parts together), the most bits
    first (unknown types last, by name)."""
    groups: dict[str, list[str]] = {}
    for p in sorted(gguf_files(sizes)):
        q = quant_of(p) or p.rsplit("/", 1)[-1]
        groups.setdefault(q, []).append(p)
    out = []
    for q, files in groups.items():
        whole = [f for f in files if not _SPLIT.search(f)]
        files = whole[:1] if whole else files        # a whole file over the parts of a split one
        out.append(GgufChoice(q, files, sum(sizes[f] for f in files)))
    return sorted(out, key=lambda c: (c.bits is None, -(c.bits or 0), c.quant))


def pick_quant(choices: list[GgufChoice], wanted: str | None, repo: str) -> GgufChoice:
    """The choice `wanted` names (case-insensitive, a type or a file name), else the default: Q8_0, or the type
    closest to it in bits per weight. PullError listing what there is when nothing matches."""
    if not choices:
        raise PullError(f"{repo} has no GGUF files")
    if wanted:
        w = _ALIASES.get(wanted.upper(), wanted.upper())
        for c in choices:
            if c.quant.upper() == w or any(f.rsplit("/", 1)[-1].upper() == w for f in c.files):
                return c
        raise PullError(f"{repo} has no {wanted} GGUF (it has: {describe(choices)})")
    known = [c for c in choices if c.bits is not None]
    if not known:
        return choices[0]
    target = QUANT_BITS[DEFAULT_QUANT]
    return min(known, key=lambda c: (abs(c.bits - target), -c.bits))


def describe(choices: list[GgufChoice]) -> str:
    """'Q8_0 145 MiB, Q4_K_M 105 MiB' (the choices as pick_quant's error lists them)."""
    return ", ".join(f"{c.quant} {human_bytes(c.size)}" for c in choices)


def human_bytes(n: int | float) -> str:
    """1536 -> '1.5 KiB'; binary units, three significant figures."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            break
        n /= 1024
    return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.1f} {unit}"
