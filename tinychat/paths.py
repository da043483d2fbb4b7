"""Where tinychat keeps its files.

Nothing here touches the file system at import or when called: these functions only compute paths.
Code that writes (session saves, kernel builds) creates the folder it needs at that moment, so merely
importing tinychat, or running `tinychat --help`, never leaves folders behind.

`$TINYCHAT_HOME`, when set, relocates everything (sessions, kernel cache) under one folder: tests point it at a
temporary directory, and a user can keep a portable install on a USB stick.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "tinychat"
HOME_ENV = "TINYCHAT_HOME"


def _env_home() -> Path | None:
    value = os.environ.get(HOME_ENV, "").strip()
    return Path(value).expanduser() if value else None


def home() -> Path:
    """The data folder: `$TINYCHAT_HOME` if set, else the platform's per-user data dir."""
    return _env_home() or platformdirs.user_data_path(APP_NAME)


def sessions_dir() -> Path:
    """Session files (`<id>.json`) and their KV snapshots (`<id>.kv.safetensors`)."""
    return home() / "sessions"


def models_dir() -> Path:
    """Imported models (`tinychat import`), one folder each, named by the model's name."""
    return home() / "models"
