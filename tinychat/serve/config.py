"""ServeConfig: what `tinychat serve` runs with, passed in (never module globals). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"             # loopback unless told otherwise
    port: int = 8080
    api_key: str | None = None          # None: no key asked (only sensible on loopback)
    max_queue: int = 16                 # requests waiting behind the running one; more get 503 + Retry-After
    max_request_bytes: int = 1 << 20    # a body larger than this is refused (413) before it is parsed
    max_tokens: int = 4096              # the most max_tokens a request may ask for (also capped by the context)
    save_sessions: Path | None = None   # each request saved as a session in this folder

    def exposed_without_key(self) -> bool:
        """Bound beyond loopback with no API key: anyone who can reach the port can use the model."""
        return self.api_key is None and self.host not in LOOPBACK
