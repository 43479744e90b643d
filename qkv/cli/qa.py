"""``qkv train qa`` and its commands."""

from __future__ import annotations


def register(commands, train_commands) -> None:
    """Add this application's commands (none yet)."""
