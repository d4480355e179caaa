"""The transformers backend's public decoding hook: what a caller may observe or steer in its
sampling loop without subclassing it (RL traces completions and replays archived ones with it).

Set ``backend.hook`` to a :class:`DecodeHook` on a backend of one's own (``with_model`` makes one
that shares a loaded backend's tokenizer and grammar tables): the backend then tells it every
token it feeds after the prompt (``fed``) and lets it pick each sampled token (``choose``, given
the allowed ids, or None where sampling is free, and the backend's own draw as a callable).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

__all__ = ["DecodeHook"]


class DecodeHook:
    """Observes and may steer one backend's decoding; the defaults change nothing."""

    def fed(self, ids: Sequence[int]) -> None:
        """Tokens fed after the prompt, in order (a determined run of a grammar string at once)."""

    def choose(self, allowed: Optional[Sequence[int]], sample: Callable[[], int]) -> int:
        """The token to take among ``allowed`` (None: any); ``sample()`` is the backend's own draw."""
        return sample()
