"""The concept pages' diagrams, drawn with matplotlib as SVG while the site is built (placeholder)."""

from __future__ import annotations


def all_diagrams() -> dict[str, str]:
    return {}
