"""The user's app preferences: what outlives a chat and is not a sampler setting (those are per turn, recorded in
the session). A small JSON file, `prefs.json` in the data folder ($TINYCHAT_HOME overrides it), written atomically;
the settings screen (F2) edits it. A file that cannot be read gives the defaults and one line saying why, never an
error that stops the app. Torch-free, no Textual."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .fsutil import atomic_write_bytes

FILE = "prefs.json"


@dataclass(frozen=True)
class Prefs:
    reopen_last: bool = False       # `tinychat` (the app) opens the most recent session, as `tinychat -c` does
    save_one_shots: bool = True     # -p / -f replies are saved as sessions (False: as if --no-save were given)

    HELP = {"reopen_last": "the app opens the last chat on start (as -c)",
            "save_one_shots": "-p / -f chats are saved (--save, --no-save decide per run)"}


def prefs_path() -> Path:
    return paths.home() / FILE


def load_prefs() -> tuple[Prefs, str | None]:
    """(the preferences, one line on why the file was not used or None). No file: the defaults, silently."""
    path = prefs_path()
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return Prefs(), None
    except (OSError, ValueError) as e:
        return Prefs(), f"{path}: not read ({type(e).__name__}): using the default preferences"
    if not isinstance(data, dict):
        return Prefs(), f"{path}: not a JSON object: using the default preferences"
    known = {f.name for f in dataclasses.fields(Prefs)}
    bad = [k for k in known if k in data and not isinstance(data[k], bool)]
    if bad:
        return Prefs(), f"{path}: {bad[0]} must be true or false: using the default preferences"
    return Prefs(**{k: v for k, v in data.items() if k in known}), None


def save_prefs(prefs: Prefs) -> Path:
    """Write the preferences (atomic); OSError when the data folder cannot take it."""
    path = prefs_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(dataclasses.asdict(prefs), indent=2) + "\n").encode())
    return path
