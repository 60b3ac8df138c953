"""A Responder's stream chunk for a delta of one choice, as the unit tests of its shapes read it."""

from __future__ import annotations

from typing import Any

from app.engine.interface import GenerationDelta
from app.openai.answers import Responder


def chunk_of(responder: Responder, delta: GenerationDelta) -> dict[str, Any] | None:
    """The chunk of a delta of one choice (None: it tells nothing yet, so no chunk is sent)."""
    chunks = responder.chunks(delta)
    assert len(chunks) <= 1, chunks
    return chunks[0] if chunks else None
