"""tinychat: a terminal chat app for small local TinyAgentLM models."""

__version__ = "0.1.0"
