"""The v2 plans' entity lists, each loaded once from its package (cached; each optional source degrades to our own
lists, topic_lists.py): countries (name, capital, continent, language, demonym) from ``countryinfo`` and how often
users would ask about each (``wordfreq``), jobs and first names from ``faker``, topic words from ``wordfreq``.
questions.py builds the user messages from them (and re-exports them)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from . import topic_lists


@functools.lru_cache(maxsize=1)
def countries() -> tuple[dict, ...]:
    """[{name, capital, continent, language, demonym}] from countryinfo's data files (fields may be "")."""
    try:
        import countryinfo
    except ImportError:
        return ()
    folder = Path(countryinfo.__file__).parent / "data"
    out = []
    for f in sorted(folder.glob("*.json")):
        d = json.loads(f.read_text(encoding="utf-8"))
        name, capital = d.get("name") or "", d.get("capital") or ""
        if isinstance(capital, list):           # a few countries list several capitals: the first is the seat
            capital = capital[0] if capital else ""
        if not (name and capital and name.isascii() and capital.isascii()) or len(name) > 24:
            continue
        region, sub = d.get("region") or "", d.get("subregion") or ""
        continent = {"Asia": "Asia", "Europe": "Europe", "Africa": "Africa", "Oceania": "Oceania"}.get(region, "")
        if region == "Americas":
            continent = {"South America": "South America", "Northern America": "North America"}.get(sub, "")
        langs = d.get("languages") or []
        out.append({"name": name, "capital": capital, "continent": continent,
                    "language": topic_lists.LANGUAGE_NAMES.get(langs[0], "") if langs else "",
                    "demonym": d.get("demonym") or ""})
    return tuple(out)


@functools.lru_cache(maxsize=1)
def jobs() -> tuple[str, ...]:
    try:
        from faker.providers.job.en_US import Provider
    except ImportError:
        return ("teacher", "nurse", "baker", "pilot", "firefighter", "farmer", "engineer", "chef", "librarian")
    keep = [j for j in Provider.jobs if "," not in j and "(" not in j and len(j.split()) <= 3]
    return tuple(j[0].lower() + j[1:] if not j.split()[0].isupper() else j for j in keep)


@functools.lru_cache(maxsize=1)
def first_names() -> tuple[str, ...]:
    try:
        from faker.providers.person.en_US import Provider
        names = set(Provider.first_names_female) | set(Provider.first_names_male)
    except ImportError:
        names = set()
    return tuple(sorted(names | set(topic_lists.NAMES_EXTRA)))


@functools.lru_cache(maxsize=1)
def country_weights() -> tuple[float, ...]:
    """v3: how often users would ask about each of countries(), from how common its name is in English (wordfreq's
    Zipf frequency z, weight 10 ** ((z - 3) / 2): Japan ~10x Luxembourg, ~25x Vatican City State); uniform
    without wordfreq."""
    try:
        import wordfreq
    except ImportError:
        return tuple(1.0 for _ in countries())
    return tuple(10 ** ((max(wordfreq.zipf_frequency(c["name"], "en"), 1.0) - 3) / 2) for c in countries())


@functools.lru_cache(maxsize=1)
def topic_words() -> tuple[str, ...]:
    """Common English words (ranks 800-15,000 of wordfreq's list), alphabetic, five letters or more."""
    try:
        import wordfreq
    except ImportError:
        return tuple(topic_lists.ANIMALS + topic_lists.OBJECTS + topic_lists.HOBBIES)
    return tuple(w for w in wordfreq.top_n_list("en", 15000)[800:] if w.isalpha() and w.isascii() and len(w) >= 5)
