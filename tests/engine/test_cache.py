"""The voice cache builds entries outside its lock: a slow (or never-ending) build never blocks the calls that
``stats``, ``reset`` or another voice need, and concurrent requests for one key share one build."""

from __future__ import annotations

import threading
import time

import pytest

from dora_primespeech_mlx.engine.cache import VoiceCache


def _slow_build(cache: VoiceCache, key, voice: str, gate: threading.Event, made: list, errors: list | None = None):
    def create():
        made.append(key)
        gate.wait(30)
        return object()

    def run():
        try:
            cache.get(key, voice, create)
        except BaseException as exc:  # noqa: BLE001 - recorded for the test
            if errors is not None:
                errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not made and time.monotonic() < deadline:
        time.sleep(0.005)
    assert made, "the build did not start"
    return thread


def _within(seconds: float, fn):
    """``fn()``'s result, run on a thread; fails when it takes longer than ``seconds`` (a blocked call)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"blocked for more than {seconds} s while another key was being built"
    return out[0]


def test_reads_and_other_keys_do_not_wait_for_a_build():
    cache = VoiceCache()
    gate, made = threading.Event(), []
    builder = _slow_build(cache, ("gpt", "a"), "A", gate, made)
    try:
        assert _within(2, cache.keys) == [] and _within(2, lambda: cache.peek(("gpt", "a"))) is None
        assert _within(2, cache.voices) == ["A"]
        assert _within(2, lambda: cache.get(("gpt", "b"), "B", lambda: "b")) == "b"  # another voice meanwhile
        _within(2, lambda: cache.set_current("B"))
        _within(2, lambda: cache.discard("reference", "A"))
        _within(2, lambda: cache.keep_only("B"))
    finally:
        gate.set()
        builder.join(10)
    assert ("gpt", "a") in cache.keys()


def test_one_build_per_key_and_every_caller_gets_it():
    cache = VoiceCache()
    gate, made = threading.Event(), []
    builder = _slow_build(cache, ("gpt", "a"), "A", gate, made)
    got = []
    waiter = threading.Thread(target=lambda: got.append(cache.get(("gpt", "a"), "A2", lambda: made.append("again"))))
    waiter.start()
    time.sleep(0.1)
    assert not got  # waits for the build in progress
    gate.set()
    builder.join(10)
    waiter.join(10)
    assert made == [("gpt", "a")]
    assert got == [cache.peek(("gpt", "a"))] and got[0] is not None


def test_a_failed_build_fails_its_waiters_and_is_retried_later():
    cache = VoiceCache()
    gate, started, errors = threading.Event(), threading.Event(), []

    def failing():
        started.set()
        gate.wait(30)
        raise OSError("unreadable")

    builder = threading.Thread(target=lambda: pytest.raises(OSError, cache.get, ("ref", 1), "A", failing))
    builder.start()
    assert started.wait(10)
    waiter = threading.Thread(target=lambda: errors.append(pytest.raises(OSError, cache.get, ("ref", 1), "A",
                                                                         lambda: "never")))
    waiter.start()
    time.sleep(0.05)
    gate.set()
    builder.join(10)
    waiter.join(10)
    assert len(errors) == 1 and cache.keys() == []
    assert cache.get(("ref", 1), "A", lambda: "fresh") == "fresh"  # the next request builds it again
