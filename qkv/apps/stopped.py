"""Why a decoder stopped, in words: the note every generating application writes for an output that did not end
by itself (:func:`stopped_note`), on stderr, in its ``--json`` row and on its page."""

from __future__ import annotations

__all__ = ["stopped_note", "LIMITS"]

#: what each limit a decoder can reach is, by the name its result's ``stopped`` gives it
LIMITS = {
    "max_len": "the most max_len allows",
    "max_rate": "the most max_rate allows for the audio's length",
    "frames": "the most the audio's length allows (4 characters a listener frame)",
    "positions": "the most the model's positions allow",
}


def stopped_note(stopped: str, count: int, what: str, unit: str) -> str | None:
    """``None`` for an output that ended by itself (``stopped`` is ``"end"``); else a sentence saying that the
    ``what`` (``"translation"``...) stopped at ``count`` ``unit`` without ending, and which limit stopped it."""
    if stopped == "end":
        return None
    return f"the {what} stopped at {count} {unit} without ending: {LIMITS.get(stopped, stopped)}"
