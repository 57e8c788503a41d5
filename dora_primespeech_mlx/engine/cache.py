"""One cache for everything loaded or computed for a voice: models, encoder backends and reference features.

Every entry has one key, ``(kind, identity)`` — for a model file ``("gpt", (resolved path, mtime))``, for the
encoders ``("encoders", (hubert path, bert path))``, for a reference ``("reference", (voice, files, stamps,
prompt, lang))`` — and remembers the voices that use it (shared encoders are used by many). Voices are kept in
least-recently-used order: the current voice is pinned, and at most ``max_other_voices`` other voices (those
used by per-request ``VOICE:`` prefixes) stay loaded; when one more is used, the oldest is forgotten and every
entry no remaining voice uses is dropped. A changed file gives a new key, so stale models are never reused.

No lock is held while an entry is built (a model load or a reference computation takes seconds, and a reference
file that never ends reading blocks for good): the first request for a key builds it, later requests for the same
key wait for that one build, and every other call (``stats``' ``keys``/``voices``/``peek``, other keys) goes on."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

Key = tuple[str, Hashable]


def file_identity(path: str | Path) -> tuple[str, int | None]:
    """(resolved path, mtime in ns or None): the identity of a model file or folder."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = None
    return str(path.resolve()), stamp


def encoders_key(hubert: str | Path, bert: str | Path) -> Key:
    """The key of a voice's encoder backends (shared by every voice with the same two folders)."""
    return ("encoders", (str(hubert), str(bert)))


class VoiceCache:
    """LRU over voices of cached entries; see the module docstring. Thread-safe."""

    def __init__(self, max_other_voices: int = 2, on_release: Callable[[], None] | None = None):
        if max_other_voices < 0:
            raise ValueError("max_other_voices must be >= 0")
        self.max_other_voices = max_other_voices
        self.on_release = on_release  # called after entries were dropped (e.g. to hand memory back)
        self._entries: dict[Key, Any] = {}
        self._users: dict[Key, set[str]] = {}
        self._voices: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._current: str | None = None
        self._building: dict[Key, Future] = {}  # keys being built now, by the thread that asked first
        self._lock = threading.RLock()

    def claim(self, key: Key, voice: str) -> tuple[bool, Any]:
        """``(True, entry)`` when ``key`` is cached (marked as used by ``voice``; a build another thread has
        claimed is waited for, its error raised), else ``(False, None)``: the caller builds the entry, outside the
        lock, and hands it to :meth:`fill` (or its error to :meth:`fail`); other requests for ``key`` wait meanwhile.
        The cache never calls the builder: what builds an entry stays with its owner (engine/store.py)."""
        while True:
            with self._lock:
                self._touch(voice)
                if key in self._entries:
                    return True, self._use(key, voice)
                pending = self._building.get(key)
                if pending is None:
                    self._building[key] = Future()
                    return False, None
            pending.result()  # another thread builds it: wait, then take it from the entries (or build anew)

    def fill(self, key: Key, voice: str, value: Any) -> Any:
        """Store the entry a :meth:`claim` left to the caller; returns it (marked as used by ``voice``)."""
        with self._lock:
            pending = self._building.pop(key)
            self._entries[key] = value
            self._users[key] = set()
            self._touch(voice)  # (another thread may have evicted the voice meanwhile)
            value = self._use(key, voice)
        pending.set_result(None)
        return value

    def fail(self, key: Key, exc: BaseException) -> None:
        """The build a :meth:`claim` left to the caller failed: the requests waiting for it get ``exc``."""
        with self._lock:
            pending = self._building.pop(key)
        pending.set_exception(exc)

    def get(self, key: Key, voice: str, create: Callable[[], Any]) -> Any:
        """The entry for ``key`` (made by ``create()`` when absent, outside the lock), marked as used by ``voice``:
        :meth:`claim`, then ``create`` and :meth:`fill` / :meth:`fail`."""
        found, value = self.claim(key, voice)
        if found:
            return value
        try:
            value = create()
        except BaseException as exc:
            self.fail(key, exc)
            raise
        return self.fill(key, voice, value)

    def peek(self, key: Key) -> Any:
        with self._lock:
            return self._entries.get(key)

    def set_current(self, voice: str) -> None:
        with self._lock:
            self._current = voice
            self._touch(voice)
            self._evict()

    def discard(self, kind: str, voice: str, keep: Key | None = None) -> None:
        """Forget ``voice``'s entries of ``kind`` other than ``keep`` (e.g. a reference made stale by an edit)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == kind and k != keep and voice in self._users[k]]:
                self._release(key, voice)

    def keep_only(self, voice: str | None) -> dict[str, int]:
        """Drop everything ``voice`` does not use; returns the number of dropped entries per kind."""
        with self._lock:
            dropped: dict[str, int] = {}
            for name in [v for v in self._voices if v != voice]:
                for kind, n in self._forget_voice(name).items():
                    dropped[kind] = dropped.get(kind, 0) + n
            return dropped

    def keys(self, kind: str | None = None) -> list[Key]:
        with self._lock:
            return [k for k in self._entries if kind is None or k[0] == kind]

    def voices(self) -> list[str]:
        """Voices holding entries, least recently used first."""
        with self._lock:
            return list(self._voices)

    # -- internals (lock held) ---------------------------------------------------------------------
    def _use(self, key: Key, voice: str) -> Any:
        self._users[key].add(voice)
        value = self._entries[key]
        self._evict()
        return value

    def _touch(self, voice: str) -> None:
        self._voices.pop(voice, None)
        self._voices[voice] = None

    def _evict(self) -> None:
        others = [v for v in self._voices if v != self._current]
        dropped = [self._forget_voice(name) for name in others[: max(0, len(others) - self.max_other_voices)]]
        if any(dropped) and self.on_release is not None:
            self.on_release()

    def _forget_voice(self, voice: str) -> dict[str, int]:
        self._voices.pop(voice, None)
        dropped: dict[str, int] = {}
        for key in [k for k, users in self._users.items() if voice in users]:
            if self._release(key, voice):
                dropped[key[0]] = dropped.get(key[0], 0) + 1
        return dropped

    def _release(self, key: Key, voice: str) -> bool:
        users = self._users[key]
        users.discard(voice)
        if users:
            return False
        del self._users[key], self._entries[key]
        return True
