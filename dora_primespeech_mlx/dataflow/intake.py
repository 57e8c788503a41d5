"""Text intake, on a thread of its own between the input thread and the worker: the LLM text stage
(``PRIMESPEECH_LLM_TEXT``) and the assembly of streamed utterances, so neither ever delays the input thread.

- A ``text`` without ``segment_id`` is parsed, cleaned by its session's LLM filter and handed on as one job; a
  ``change_voice`` passes through in turn, so it keeps its place among the texts.
- A ``text`` with a ``segment_id`` is a fragment of an :class:`.utterance.Utterance`: put in ``seq`` order, cleaned
  by its segment's LLM filter (:mod:`.streams`), cut into sentences, each handed on once complete. ``fin``, the
  idle wait (``PRIMESPEECH_SEGMENT_IDLE_S``) or the inputs closing end it; past :data:`MAX_OPEN` open, the oldest
  ends (its unsent text discarded).
- Bounded (docs/security.md): fragment size, held characters per utterance, characters queued here; cancelled
  utterances are remembered for :data:`FORGET_AFTER_S` (:class:`Forgotten`).

:meth:`Intake.hold` stops the thread between two items, so a reset or a barge-in on the input thread sees every
text either still queued here or already handed on, never one in between.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from .sentences import LlmFeed
from .streams import Filters
from .utterance import MAX_HELD_FRAGMENTS, Fragment, Utterance, session_of

MAX_OPEN = 64  # utterances assembled at once
MAX_ENDED = 256  # ended segments whose next seq is remembered (a segment that goes on, a repeated fragment)
FORGET_AFTER_S = 300.0  # a cancelled utterance's late fragments are dropped for this long after its cancel
MAX_FORGOTTEN = 100_000  # cancelled utterances remembered at once (8 bytes each, by hash), whatever the window
TICK_S = 0.05  # the shortest sleep while an utterance is open (its idle wait is checked after it)


class Forgotten:
    """Cancelled utterances, by the hash of their key, each for ``window_s`` after its cancel: a sender cannot
    exhaust it by cancelling many (only by cancelling more than ``cap`` within the window, which is reported)."""

    def __init__(self, log: Callable[[str, str], None], window_s: float = FORGET_AFTER_S, cap: int = MAX_FORGOTTEN):
        self._log, self.window_s, self.cap = log, window_s, cap
        self._until: OrderedDict[int, float] = OrderedDict()  # hash(key) -> until when, the oldest first
        self._lock = threading.Lock()
        self._warned = False

    def add(self, key: tuple[str, str]) -> None:
        now = time.monotonic()
        h = hash(key)
        with self._lock:
            self._until.pop(h, None)
            self._until[h] = now + self.window_s
            while self._until and next(iter(self._until.values())) <= now:
                self._until.popitem(last=False)
            if len(self._until) > self.cap:
                self._until.popitem(last=False)
                warn, self._warned = not self._warned, True
            else:
                warn = False
        if warn:
            self._log("WARNING", f"more than {self.cap} utterances cancelled within {self.window_s:g} s "
                                 "(MAX_FORGOTTEN): the oldest are forgotten early, a late fragment of one starts "
                                 "a new utterance")

    def __contains__(self, key: tuple[str, str]) -> bool:
        with self._lock:
            until = self._until.get(hash(key))
        return until is not None and until > time.monotonic()

    def __len__(self) -> int:
        return len(self._until)


class Intake:
    """Queue of texts and fragments and the thread that works it off (see the module docstring).

    ``admission`` (:class:`.admission.Admission`) parses a plain text (``parse``, running the LLM filter) and takes
    each text and sentence on (``admit``, ``sentence``); ``answers`` (:class:`.answers.Answers`) is told once an
    utterance takes no more sentences (``closed``); its outputs' ``log`` reports."""

    def __init__(self, admission, answers, llm_text: bool, idle_s: float, filters: Filters | None = None,
                 max_held_chars: int = 20000, max_chars: int = 2_000_000):
        self.admission, self.answers = admission, answers
        self._log = log = answers.out.log
        self.llm_text = llm_text
        self.idle_s = idle_s
        self.filters = filters if filters is not None else Filters(log, llm_text)
        self.max_held_chars = max_held_chars  # PRIMESPEECH_MAX_HELD_CHARS
        self.max_chars = max_chars  # PRIMESPEECH_MAX_INTAKE_CHARS
        self.chars = 0  # characters of the texts and fragments queued here
        self._items: deque[tuple] = deque()
        self._cv = threading.Condition()
        self._busy = threading.RLock()  # held while one item is worked on (see hold)
        self.open: OrderedDict[tuple[str, str], Utterance] = OrderedDict()
        self._forgotten = Forgotten(log)
        self._ended: OrderedDict[tuple[str, str], int] = OrderedDict()  # ended utterances: the next fragment's seq
        self._working = False
        self._in_hand: str | None = None  # the kind of the item being worked on
        self._stopped = False

    # -- input thread --------------------------------------------------------------------------------------
    def room(self, chars: int) -> bool:
        """Whether ``chars`` more characters fit in the intake (PRIMESPEECH_MAX_INTAKE_CHARS)."""
        with self._cv:
            return self.chars + chars <= self.max_chars

    def put_text(self, job: Any, raw: str) -> None:
        self._put(("text", job, raw))

    def put_control(self, job: Any) -> None:
        """A control job that keeps its place among the texts (``change_voice``): handed on in turn."""
        self._put(("control", job))

    def put_fragment(self, key: tuple[str, str], metadata: dict, stamp: Any, fragment: Fragment) -> None:
        self._put(("fragment", key, metadata, stamp, fragment))

    def _put(self, item: tuple) -> None:
        with self._cv:
            self._items.append(item)
            self.chars += _chars(item)
            self._cv.notify_all()

    @contextmanager
    def hold(self):
        """Keep the thread from starting the next item while the caller cancels (an item in hand finishes)."""
        with self._busy:
            yield

    def take(self, before: Any = None, keep: tuple[str, str] | None = None,
             session: str | None = None) -> tuple[list[Any], list[Utterance]]:
        """Under :meth:`hold`: remove the queued plain texts and every utterance sent before the stamp ``before``
        (all when None) but the one keyed ``keep`` (``session``: only that session's), also those whose fragments
        are all still queued here (they arrived: each is answered); their queued fragments are dropped. Returns
        (text jobs, utterances), to be answered by the caller."""

        def sent_before(st: Any, key: tuple[str, str] | None = None, job: Any = None) -> bool:
            if keep is not None and key == keep:
                return False
            if session is not None and (key[0] if key is not None else session_of(job.metadata)) != session:
                return False
            return before is None or st is None or st.before(before)

        with self._cv:
            jobs = [item[1] for item in self._items if item[0] == "text" and sent_before(item[1].stamp, None, item[1])]
            gone = [k for k, u in self.open.items() if sent_before(u.stamp, k)]
            utterances = [self.open.pop(k) for k in gone]
            unopened: dict[tuple[str, str], tuple] = {}  # utterances whose first fragment is still queued here
            for item in self._items:
                if item[0] == "fragment" and item[1] not in self.open and item[1] not in gone \
                        and item[1] not in unopened and sent_before(item[3], item[1]):
                    unopened[item[1]] = item
            utterances += [Utterance(key, item[2], item[3], LlmFeed(None)) for key, item in unopened.items()]
            dropped = set(gone) | set(unopened)
            for key in dropped:
                self.forget(key)
            self._items = deque(item for item in self._items if not (
                (item[0] == "text" and sent_before(item[1].stamp, None, item[1]))
                or (item[0] == "fragment" and item[1] in dropped)))
            self.chars = sum(_chars(item) for item in self._items)
            return jobs, utterances

    def forgotten(self, key: tuple[str, str]) -> bool:
        return key in self._forgotten

    def forget(self, key: tuple[str, str]) -> None:
        """Drop the fragments of ``key`` from now on (a cancelled utterance), and its LLM filter."""
        self._forgotten.add(key)
        self.filters.drop(key)

    def live(self, key: tuple[str, str]) -> bool:
        """Under :meth:`hold`: whether an utterance of ``key`` is open or has fragments queued here."""
        with self._cv:
            return key in self.open or any(item[0] == "fragment" and item[1] == key for item in self._items)

    def repeat(self, key: tuple[str, str], seq: int | None) -> bool:
        """Under :meth:`hold`: whether fragment ``seq`` of ``key`` belongs to a part of its segment already ended."""
        return seq is not None and key in self._ended and seq < self._ended[key]

    def queued_texts(self) -> int:
        """Plain texts waiting here (and the one in hand)."""
        with self._cv:
            return sum(item[0] == "text" for item in self._items) + (self._in_hand == "text")

    def pending(self) -> int:
        """Items queued or in hand (an open utterance waiting for its next fragment is no work)."""
        with self._cv:
            return len(self._items) + self._working

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        threading.Thread(target=self._main, name="primespeech-intake", daemon=True).start()

    def close_all(self) -> None:
        """The inputs closed: work off what is queued, then end every open utterance (its rest is spoken)."""
        with self._cv:
            self._cv.wait_for(lambda: not self._items and not self._working, 30.0)
        with self._busy:
            for key in list(self.open):
                self._end(key)

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    # -- the thread ----------------------------------------------------------------------------------------
    def _main(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._items or self._stopped, self._next_deadline())
                if self._stopped:
                    return
            with self._busy:
                with self._cv:
                    item = self._items.popleft() if self._items else None
                    if item is not None:
                        self.chars -= _chars(item)
                    self._working = item is not None
                    self._in_hand = item[0] if item is not None else None
                try:
                    if item is not None:
                        self._work(item)
                    self._end_idle()
                except Exception as exc:  # noqa: BLE001 - keep the intake alive; the item's job is answered
                    self._log("ERROR", f"intake: {type(exc).__name__}: {exc}")
                    if item is not None and item[0] == "text":
                        item[1].error = item[1].error or f"internal error: {type(exc).__name__}: {exc}"
                        self.admission.admit(item[1])
                finally:
                    with self._cv:
                        self._working, self._in_hand = False, None
                        self._cv.notify_all()

    def _work(self, item: tuple) -> None:
        if item[0] == "control":
            self.admission.admit(item[1])
            return
        if item[0] == "text":
            _, job, raw = item
            if job.error is None:
                self.admission.parse(job, raw)
            self.admission.admit(job)
            return
        _, key, metadata, stamp, fragment = item
        if key in self._forgotten:
            return  # a fragment of a cancelled utterance
        utterance = self.open.get(key)
        if utterance is None and self.repeat(key, fragment.seq):
            self._log("WARNING", f"session {key[0]!r} segment {key[1]!r}: fragment seq {fragment.seq} dropped: "
                                 f"that part of the segment ended already (a repeat)")
            return
        if utterance is None:
            utterance = self._open(key, metadata, stamp)
        if fragment.error is not None:
            self._log("WARNING", f"session {key[0]!r} segment {key[1]!r}: fragment left out: {fragment.error}")
            with utterance.lock:
                if not any(stage == "input" for _, stage in utterance.errors):  # the first one (the answer's)
                    utterance.errors.append((fragment.error, "input"))
        if fragment.seq is not None and fragment.seq < utterance.next_seq:
            self._log("WARNING", f"session {key[0]!r} segment {key[1]!r}: fragment seq {fragment.seq} dropped: "
                                 f"a repeat (the next expected is {utterance.next_seq})")
        skipped = utterance.skipped_gaps
        in_order = utterance.accept(fragment, self.max_held_chars)
        if utterance.skipped_gaps != skipped:
            self._log("WARNING", f"session {key[0]!r} segment {key[1]!r}: more than {MAX_HELD_FRAGMENTS} early "
                                 f"fragments or {self.max_held_chars} characters held (PRIMESPEECH_MAX_HELD_CHARS) "
                                 f"waiting for a missing seq: the gap is skipped")
        for ready in in_order:
            for sentence in utterance.sentences_of(ready):
                self._hand_on(utterance, sentence)
            if ready.fin:
                self._end(key, finished=True)
                break

    def _open(self, key: tuple[str, str], metadata: dict, stamp: Any) -> Utterance:
        while len(self.open) >= MAX_OPEN:
            oldest = next(iter(self.open))
            self._log("WARNING", f"more than {MAX_OPEN} utterances open: ending session {oldest[0]!r} segment "
                                 f"{oldest[1]!r}; its text not yet spoken is discarded")
            self._end(oldest, evicted=True)
        utterance = Utterance(key, metadata, stamp, self.filters.segment(key))
        utterance.next_seq = self._ended.pop(key, 0)  # a segment that goes on after its idle wait ended it
        self.open[key] = utterance
        return utterance

    def _hand_on(self, utterance: Utterance, sentence: str) -> None:
        with utterance.lock:
            utterance.sentences += 1
        self.admission.sentence(utterance, sentence)

    def _end(self, key: tuple[str, str], finished: bool = False, evicted: bool = False) -> None:
        """Close an utterance: its held text is spoken (``evicted``: discarded), it takes no more sentences. Its
        segment's LLM filter goes at ``fin`` (``finished``), else it stays for the segment's next utterance."""
        utterance = self.open.pop(key, None)
        if utterance is None:
            return
        if evicted:
            utterance.discard()
        elif not finished:
            for sentence in utterance.rest():
                self._hand_on(utterance, sentence)
        if finished:
            self.filters.drop(key)
        else:
            self.filters.release(key)
        with utterance.lock:
            utterance.closed = True
        self._ended[key] = utterance.next_seq
        self._ended.move_to_end(key)
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)
        self.answers.closed(utterance)

    def _next_deadline(self) -> float | None:
        """Seconds until the first open utterance's idle wait runs out (None: none open, sleep until work comes)."""
        lasts = [u.last_input for u in list(self.open.values())]
        if not lasts:
            return None
        return max(TICK_S, min(lasts) + self.idle_s - time.monotonic())

    def _end_idle(self) -> None:
        now = time.monotonic()
        for key in [k for k, u in self.open.items() if now - u.last_input >= self.idle_s]:
            self._log("INFO", f"session {key[0]!r} segment {key[1]!r}: no fragment for {self.idle_s:g} s "
                              "(PRIMESPEECH_SEGMENT_IDLE_S): its rest is spoken and the utterance ends")
            self._end(key)


def _chars(item: tuple) -> int:
    """The characters a queued item holds (a text's raw string, a fragment's text)."""
    if item[0] == "text":
        return len(item[2])
    if item[0] == "fragment":
        return len(item[4].text)
    return 0
