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
    error: str | None = None  # why its text was left out (a bound), recorded on its utterance


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
    heard: Heard = field(default_factory=lambda: Heard(""))  # its text (the LLM stage's output) and what went out
    # per sentence handed out (its ``part``): (its tile's start: where the sentence before it ended, its own start
    # and end) in :attr:`heard`'s text; the tiles of the sentences tile the text through the last one
    tiles: list[tuple[int, int, int]] = field(default_factory=list)
    _placed: int = 0
    _tail: str = ""  # the utterance's text from ``_tail_at`` on: where the next sentence is looked for
    _tail_at: int = 0
    skip_reason: str | None = None
    held_chars: int = 0  # characters of the fragments in ``held``

    # -- fragments (intake thread) ----------------------------------------------------------------------
    def accept(self, fragment: Fragment, max_held_chars: int | None = None) -> list[Fragment]:
        """The fragments that are now in order (``fragment`` and any held ones it unblocks). A fragment older
        than the next expected one (a duplicate) is dropped; past :data:`MAX_HELD_FRAGMENTS` held (or
        ``max_held_chars`` characters of them), the gap is skipped."""
        self.last_input = time.monotonic()
        if fragment.seq is None:
            return [fragment]
        if fragment.seq < self.next_seq:
            return []
        old = self.held.get(fragment.seq)
        self.held_chars += len(fragment.text) - (len(old.text) if old is not None else 0)
        self.held[fragment.seq] = fragment
        if self.next_seq not in self.held and (len(self.held) > MAX_HELD_FRAGMENTS or (
                max_held_chars is not None and self.held_chars > max_held_chars)):
            self.next_seq = min(self.held)
            self.skipped_gaps += 1
        ready = []
        while self.next_seq in self.held:
            ready.append(self.held.pop(self.next_seq))
            self.held_chars -= len(ready[-1].text)
            self.next_seq += 1
        return ready

    def discard(self) -> None:
        """Drop what is held and not yet spoken (the utterance was ended to make room); the segment's filter keeps
        its open block."""
        if self.held:
            self.next_seq = max(self.held) + 1
        self.held.clear()
        self.held_chars = 0
        self.feed.discard()
        self.cutter.discard()
        self._placed = self._tail_at + len(self._tail)  # what the cutter held is not spoken: no tile covers it
        self._tail, self._tail_at = "", self._placed

    def sentences_of(self, fragment: Fragment) -> list[str]:
        """The sentences ``fragment`` completes (all that is left at ``fin``)."""
        out = self._push(self.feed.push(fragment.text))
        if fragment.fin:
            out += self._push(self.feed.finish()) + self._place(self.cutter.finish())
        return out

    def rest(self) -> list[str]:
        """Everything still held, as sentences (the idle wait ran out, or the inputs closed)."""
        seqs = sorted(self.held)
        held = [self.held.pop(k) for k in seqs]
        self.held_chars = 0
        if seqs:
            self.next_seq = seqs[-1] + 1  # a fragment after these is the segment's next
        out = []
        for fragment in held:
            out += self._push(self.feed.push(fragment.text))
        return out + self._push(self.feed.finish()) + self._place(self.cutter.finish())

    def _push(self, spoken: str) -> list[str]:
        """The LLM stage's ``spoken`` text to the sentence cutter (and to the utterance's text)."""
        self.heard.extend(spoken)
        self._tail += spoken
        return self._place(self.cutter.push(spoken))

    def _place(self, sentences: list[str]) -> list[str]:
        """Where each new sentence lies in the utterance's text (:attr:`tiles`): a sentence is a stripped piece of
        it, in order, so only white space lies between the end of the one before it and its start."""
        for sentence in sentences:
            at = self._tail.find(sentence, self._placed - self._tail_at)
            at = self._placed if at < 0 else self._tail_at + at  # (< 0 cannot happen: the cutter returns pieces)
            self.tiles.append((self._placed, at, at + len(sentence)))
            self._placed = at + len(sentence)
        # only the text not yet placed is searched again: linear in the utterance, however it is fed
        self._tail, self._tail_at = self._tail[self._placed - self._tail_at:], self._placed
        return sentences

    # -- sentences (worker) ----------------------------------------------------------------------------
    def part_done(self, outcome: str, error: str | None = None, stage: str | None = None) -> bool:
        """Record one sentence's outcome; True when the utterance is now complete (closed, all answered)."""
        with self.lock:
            self.finished += 1
            if outcome == "completed":
                self.spoken += 1
            elif outcome == "error":
                self.errors.append((error or "error", stage or "synthesis"))
            elif error and not self.skip_reason:
                self.skip_reason = error  # the first skipped sentence's reason (``error``: a skip's reason)
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
        """(``completed`` | ``skipped`` | ``error``, error or skip reason, stage): completed when any sentence was
        spoken."""
        if self.spoken:
            return "completed", None, None
        if self.errors:
            return "error", *self.errors[0]
        return "skipped", self.skip_reason, None

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


@dataclass
class Heard:
    """What of one text (a plain text, or an utterance's joined text) went out as audio: ``text`` is what the LLM
    stage left of it (the text the audio's spans index). Updated by each audio chunk sent (:meth:`sent`); a
    cancelled text or utterance reports it (:meth:`report`)."""

    text: str
    audio_s: float = 0.0  # seconds of audio sent
    whole_to: int = 0  # the end of the last sentence whose audio went out whole
    sent_to: int = 0  # the end of the last span whose audio started
    cut: tuple[int, int] | None = None  # the sentence whose audio started and did not end

    _more: list[str] = field(default_factory=list)  # text appended since ``text`` was last joined

    def extend(self, more: str) -> None:
        """Append to the text (joined when read: an utterance fed by many fragments stays linear)."""
        if more:
            self._more.append(more)

    def joined(self) -> str:
        if self._more:
            self.text, self._more = self.text + "".join(self._more), []
        return self.text

    def sent(self, start: int, end: int, seconds: float, sentence: tuple[int, int] | None, done: bool) -> None:
        """A chunk of ``seconds`` with the span (``start``, ``end``) went out; it belongs to ``sentence`` (None: the
        one of the chunk before it), whose last chunk it is when ``done``."""
        self.audio_s += seconds
        self.sent_to = max(self.sent_to, end)
        if sentence is not None:
            self.cut = sentence
        if done:
            self.whole_to, self.cut = max(self.whole_to, self.sent_to), None

    def report(self) -> dict:
        """The metadata a cancelled text or utterance is answered with: what the listener got."""
        text = self.joined()
        md: dict[str, Any] = {"spoken_text": text[:self.whole_to], "spoken_end": self.whole_to,
                              "audio_sent_s": round(self.audio_s, 3)}
        if self.cut is not None:
            start, end = self.cut
            sent = min(max(self.sent_to, start), end)
            md.update(cut_text=text[start:end], cut_start=start, cut_end=end,
                      cut_sent_text=text[start:sent], cut_sent_end=sent)
        return md


def convention(md: dict) -> tuple[Any, Any, bool, bool]:
    """(segment_id, seq, fin, flush) of an input's metadata; a non-int ``seq`` counts as absent."""
    seq = md.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        seq = None
    return md.get("segment_id"), seq, md.get("fin") is True, md.get("flush") is True


def session_of(metadata: dict) -> str:
    """The session a text belongs to: its ``session_id`` as a string (``default`` without one), as an utterance's
    key names it."""
    return str(metadata.get("session_id", "default"))


def without_convention(md: dict) -> dict:
    """``md`` without the per-message convention keys (``seq``, ``fin``, ``flush``)."""
    return {k: v for k, v in md.items() if k not in CONVENTION_KEYS}
