"""A sampled token's trace (sampler.TokenTrace) as an OpenAI logprobs entry, plus what no other server gives: the
`tinychat` field, why this token was chosen.

logprob: the natural log of the token's probability in the distribution it was drawn from, after the repetition
penalty, the phrase ban and the temperature (T = 0, greedy: at T = 1), before the top-p cut. top_logprobs: the most
likely tokens of that distribution (banned ones, probability 0, are left out: the `tinychat` field lists them).

    "tinychat": {"id": 2031, "p": 0.41, "p_raw": 0.38, "rank": 0,
                 "banned": [{"id": 17, "token": " the", "p_raw": 0.2, "ngram": [" of", " all", " the"]}],
                 "banned_total": 3, "banned_mass": 0.27, "lifted": false,
                 "penalised": [{"id": 99, "token": " cat", "p_raw": 0.05, "p": 0.02}]}

banned: the candidates the phrase ban removed at this step (the trace's top ones), each with the 3-gram that banned
it (the two tokens before it and itself); banned_total / banned_mass: all ids it removed and their raw probability;
lifted: the dead-end guard lifted the earlier turns' bans at this step; penalised: candidates under the repetition
penalty. p_raw: before penalty and ban. rank: the token's place in the final distribution (0: the most likely).
Torch-free: it reads the trace's plain numbers."""
from __future__ import annotations

import math

NO_PROB = -9999.0       # OpenAI's logprob for a token of probability 0 (JSON has no -inf)


def logprob(p: float) -> float:
    return math.log(p) if p > 0 else NO_PROB


def _text(tok, tid: int) -> str:
    return tok.decode([tid])


def _item(tok, tid: int, p: float) -> dict:
    """token: the text (a partial UTF-8 character decodes to U+FFFD), bytes: the token's own bytes, exact."""
    return {"token": _text(tok, tid), "logprob": logprob(p), "bytes": list(tok.token_bytes(tid))}


def explain(tok, tr) -> dict:
    """The `tinychat` field of one token's entry."""
    cands = sorted(tr.candidates, key=lambda c: -c.p_raw)
    banned = []
    for c in cands:
        if c.banned_by is not None:
            banned.append({"id": c.token, "token": _text(tok, c.token), "p_raw": c.p_raw,
                           "ngram": [_text(tok, t) for t in c.banned_by] + [_text(tok, c.token)]})
    penalised = [{"id": c.token, "token": _text(tok, c.token), "p_raw": c.p_raw, "p": c.p_final}
                 for c in cands if c.penalised]
    return {"id": tr.token, "p": tr.p_final, "p_raw": tr.p_raw, "rank": tr.rank, "banned": banned,
            "banned_total": len(tr.banned), "banned_mass": tr.banned_mass, "lifted": tr.lifted,
            "penalised": penalised}


def entry(tok, tr, top: int) -> dict:
    """The chat logprobs entry of one sampled token; top: how many top_logprobs (0-20)."""
    d = _item(tok, tr.token, tr.p_final)
    alts = sorted((c for c in tr.candidates if c.p_final > 0), key=lambda c: -c.p_final)[:top]
    d["top_logprobs"] = [_item(tok, c.token, c.p_final) for c in alts]
    d["tinychat"] = explain(tok, tr)
    return d


def legacy(entries: list[dict], offsets: list[int]) -> dict:
    """/v1/completions' logprobs object from chat entries and each token's character offset in the text."""
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries],
            "text_offset": list(offsets), "tinychat": [e["tinychat"] for e in entries]}
