"""One streamed utterance: the ``text`` fragments of one (``session_id``, ``segment_id``), dora's streaming
convention (docs/dataflow.md, "LLM token streams").

An :class:`Utterance` puts its fragments back in ``seq`` order (bounded), turns them into sentences
(:mod:`.sentences`), counts the sentences it handed out and their outcomes, numbers its audio chunks (``seq``
0, 1, 2, ... across all its sentences, ``fin`` on the last) and decides its one answer. It is driven by the
intake thread (fragments) and the worker (sentence outcomes, audio); its state is guarded by ``lock``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .sentences import LlmFeed, SentenceCutter

CONVENTION_KEYS = ("seq", "fin", "flush")  # per message; never echoed as they came
MAX_HELD_FRAGMENTS = 64  # fragments waiting for an earlier one; past this the gap is skipped


@dataclass
class Fragment:
    text: str
    seq: int | None  # the fragment number within its segment (None: in arrival order)
    fin: bool


@dataclass(eq=False)
class Utterance:
    key: tuple[str, str]  # (session_id, segment_id)
    metadata: dict  # the first fragment's, without the per-message keys: echoed on the answer and the audio
    stamp: Any  # order.Stamp of the first fragment: the utterance's place among texts and controls
    feed: LlmFeed
    cutter: SentenceCutter = field(default_factory=SentenceCutter)
    lock: threading.RLock = field(default_factory=threading.RLock)
    next_seq: int = 0
    held: dict[int, Fragment] = field(default_factory=dict)
    closed: bool = False  # fin seen (or the idle wait ran out): no more sentences
    sentences: int = 0  # handed out
    finished: int = 0  # answered (spoken, skipped, failed)
    spoken: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # (error, stage) of failed sentences
    chunks: int = 0  # audio chunks sent: the next chunk's seq
    fin_sent: bool = False
    _claimed: bool = False
    last_input: float = field(default_factory=time.monotonic)
    skipped_gaps: int = 0

    # -- fragments (intake thread) ----------------------------------------------------------------------
    def accept(self, fragment: Fragment) -> list[Fragment]:
        """The fragments that are now in order (``fragment`` and any held ones it unblocks). A fragment older
        than the next expected one (a duplicate) is dropped; past :data:`MAX_HELD_FRAGMENTS` held, the gap is
        skipped."""
        self.last_input = time.monotonic()
        if fragment.seq is None:
            return [fragment]
        if fragment.seq < self.next_seq:
            return []
        self.held[fragment.seq] = fragment
        if self.next_seq not in self.held and len(self.held) > MAX_HELD_FRAGMENTS:
            self.next_seq = min(self.held)
            self.skipped_gaps += 1
        ready = []
        while self.next_seq in self.held:
            ready.append(self.held.pop(self.next_seq))
            self.next_seq += 1
        return ready

    def sentences_of(self, fragment: Fragment) -> list[str]:
        """The sentences ``fragment`` completes (all that is left at ``fin``)."""
        out = self.cutter.push(self.feed.push(fragment.text))
        if fragment.fin:
            out += self.cutter.push(self.feed.finish()) + self.cutter.finish()
        return out

    def rest(self) -> list[str]:
        """Everything still held, as sentences (the idle wait ran out, or the inputs closed)."""
        seqs = sorted(self.held)
        held = [self.held.pop(k) for k in seqs]
        if seqs:
            self.next_seq = seqs[-1] + 1  # a fragment after these is the segment's next
        out = []
        for fragment in held:
            out += self.cutter.push(self.feed.push(fragment.text))
        return out + self.cutter.push(self.feed.finish()) + self.cutter.finish()

    # -- sentences (worker) ----------------------------------------------------------------------------
    def part_done(self, outcome: str, error: str | None = None, stage: str | None = None) -> bool:
        """Record one sentence's outcome; True when the utterance is now complete (closed, all answered)."""
        with self.lock:
            self.finished += 1
            if outcome == "completed":
                self.spoken += 1
            elif outcome == "error":
                self.errors.append((error or "error", stage or "synthesis"))
            return self.complete

    @property
    def complete(self) -> bool:
        return self.closed and self.finished >= self.sentences

    def claim(self) -> bool:
        """True exactly once: the caller that gets True sends the utterance's one ``segment_complete``."""
        with self.lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    @property
    def answered(self) -> bool:
        return self._claimed

    def outcome(self) -> tuple[str, str | None, str | None]:
        """(``completed`` | ``skipped`` | ``error``, error, stage): completed when any sentence was spoken."""
        if self.spoken:
            return "completed", None, None
        if self.errors:
            return "error", *self.errors[0]
        return "skipped", None, None

    def chunk_metadata(self, final_of_sentence: bool, part: int | None) -> dict:
        """The convention keys of the next audio chunk of sentence ``part`` (None: a closing chunk): ``seq``
        counts the utterance's chunks, ``fin`` marks the last one (the final chunk of its last sentence once the
        utterance is closed)."""
        with self.lock:
            md: dict[str, Any] = {"seq": self.chunks}
            self.chunks += 1
            last = part is None or part == self.sentences - 1
            md["fin"] = bool(final_of_sentence and last and self.closed and not self.fin_sent)
            self.fin_sent = self.fin_sent or md["fin"]
            return md


def convention(md: dict) -> tuple[Any, Any, bool, bool]:
    """(segment_id, seq, fin, flush) of an input's metadata; a non-int ``seq`` counts as absent."""
    seq = md.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        seq = None
    return md.get("segment_id"), seq, md.get("fin") is True, md.get("flush") is True


def without_convention(md: dict) -> dict:
    """``md`` without the per-message convention keys (``seq``, ``fin``, ``flush``)."""
    return {k: v for k, v in md.items() if k not in CONVENTION_KEYS}
