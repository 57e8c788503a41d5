"""Memory hand-back at the end of a request (engine/store.py ``trim_after_request``): MLX's buffer cache is
emptied and the heap's free pages go back to the OS. The RSS figures themselves come from
``primespeech-mlx bench`` (``--memory-levers``), not from a test."""

from __future__ import annotations

import sys

import mlx.core as mx
import pytest

from dora_primespeech_mlx.engine import store


def test_trim_after_request_empties_the_mlx_cache():
    a = mx.ones((1024, 1024))
    mx.eval(a)
    del a  # freed into MLX's buffer cache
    assert mx.get_cache_memory() > 0
    store.trim_after_request()
    assert mx.get_cache_memory() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_trim_after_request_hands_freed_heap_back(monkeypatch):
    from dora_primespeech_mlx.models import storage

    calls = []
    real = storage.trim_heap
    monkeypatch.setattr(storage, "trim_heap", lambda: calls.append(1) or real())
    store.trim_after_request()
    assert calls == [1]
