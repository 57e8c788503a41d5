"""One streamed request as an object, behind one seam: :class:`Stream` owns the request's stream state (its
sentences' windows, their pacers, the speeds it measures, the decode batch it joins, the vocoder lane), and the engine
hands it :class:`EnginePorts` (the lock, the counters, the speeds, the batch, the lane, the pacing plan) when the
request starts: nothing else of the engine is reachable from a stream, and no stage reaches into another's private
members (tests/engine/test_stream_seam.py). :class:`Schedule` is what the caller knows about the audio around the
text (the texts it will ask for next, when the audio it sent before will have played); a :class:`~..board.Board` is
the same as data a caller that keeps a queue (the node) pushes whenever it changes, so that the engine reads values
and never calls back into the caller's code.

The stream is made of one stage per module: it reads each sentence token by token from the engine's decode batch
(engine/batching.py), asks its pacer (engine/pacing.py) after each token whether to cut a window, decodes the window
(engine/streaming.py, the vocoder on the lane beside the GPT where the listener has audio in hand: engine/overlap.py)
and hands out the finished pieces in order. Between tokens a waiting sentence may join the decode batch. The engine
lock is taken per token and per window, so a stream consumed in one thread and a request from another interleave
safely. Its one public entry is ``GPTSoVITSEngine.synthesize_stream``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from . import overlap, pacing, pipeline, streaming
from .batching import Batching, Upcoming, solo
from .config import AudioChunk
from .rates import StreamRates
from .stats import EngineStats, Timer, stage
from .store import trim_after_request


class Listener(Protocol):
    """What a stream knows of its caller (the node's: ``board.listener(key)`` of the board onto which it pushes its
    queue and playback clock, read here as data): ``key`` names this text among the texts the caller
    lists in ``upcoming()``; ``upcoming()`` lists the texts it will ask for next, in order (None: it keeps no queue);
    ``playing_until()`` says when (``time.perf_counter()``) the audio it sent before this text will have played
    (None: the listener waits for this text's first audio)."""

    key: Any

    def upcoming(self) -> Sequence[Upcoming] | None: ...

    def playing_until(self) -> float | None: ...


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A :class:`Listener` from plain values: ``key``, ``texts`` (a callable returning the upcoming texts, or None)
    and ``until`` (the ``playing_until`` time, or None)."""

    key: Any = None
    texts: Callable[[], Sequence[Upcoming]] | None = None
    until: float | None = None

    def upcoming(self) -> Sequence[Upcoming] | None:
        return None if self.texts is None else self.texts()

    def playing_until(self) -> float | None:
        return self.until


NO_SCHEDULE = Schedule()  # a caller that keeps no queue and has sent nothing before this text


@dataclasses.dataclass(frozen=True)
class EnginePorts:
    """What a stream uses of its engine, handed over by the engine when the request starts (its
    ``synthesize_stream``): the stream reaches the engine through these and nothing else.

    ``lock``: the engine lock (re-entrant; the stream takes it per token and per window); ``on_device``: a new
    context of the engine's device scope; ``stats``: the engine's counters; ``rates``: the measured speeds the
    stream paces by and adds to; ``batching``: the engine's decode batch and the queued texts that joined it;
    ``batch_width``: the batch's width setting (``PRIMESPEECH_BATCH``); ``options``: the pacing plan of this
    stream; ``lane``: the vocoder lane for its voice (None: the vocoder runs in turn); ``follow_busy_lane``: the
    runtime's choice (engine/overlap.py); ``noise_bank``: ``(seed, sentence), channels`` -> the SoVITS noise;
    ``prepare_joined``: ``(request, Upcoming)`` -> a queued text's request prepared to join the request's decode
    batch, or None where it cannot."""

    lock: AbstractContextManager
    on_device: Callable[[], AbstractContextManager]
    stats: EngineStats
    rates: StreamRates
    batching: Batching
    batch_width: int
    options: pacing.PacingOptions
    lane: overlap.VocoderLane | None
    follow_busy_lane: bool
    noise_bank: Callable[[Any, int], Any]
    prepare_joined: Callable[[Any, Upcoming], Any]


@dataclasses.dataclass
class _Sentence:
    """The state of the sentence being read: its tokens, its pacer and what was measured since its last cut."""

    index: int
    chunk: pipeline.TextChunk
    stitcher: streaming.Stitcher
    bank: Any
    tokens_gen: Iterator
    pacer: pacing.Pacer
    tokens: list[int] = dataclasses.field(default_factory=list)
    cut_at: int = 0  # tokens at the last cut
    decode_s: float = 0.0  # GPT seconds since the last cut
    lane_was_busy: bool = False
    steps: int = 0  # the batch's steps and row steps at the last cut (a window's steps with other rows beside it)
    row_steps: int = 0


class Stream:
    """One streamed request (``request``: its prepared ``core._Request``) of the engine whose ``ports`` it is given
    (:class:`EnginePorts`). The engine's interface to it: construct it, iterate it. ``iter(stream)`` is the generator
    of its :class:`AudioChunk` pieces (``synthesize_stream`` returns it: closing or dropping it ends the request as a
    cancel does; the stream holds no reference to it, so that happens at once).
    ``windows``: (sentence, new tokens) of each window cut so far, in order (the first is the first piece's)."""

    def __init__(self, ports: EnginePorts, request, timer: Timer, t_start: float, cancel, listener: Listener,
                 playing_until: float | None):
        self.ports, self.r, self.timer, self.t_start, self.cancel = ports, request, timer, t_start, cancel
        self.listener, self.playing_until = listener, playing_until
        self.sr, self.last = request.models.sample_rate, len(request.chunks) - 1
        self.options: pacing.PacingOptions = ports.options  # the engine's, when the stream starts
        self.lane: overlap.VocoderLane | None = ports.lane
        self.batch = None
        self.pending: collections.deque = collections.deque()  # (sentence, final, PendingPiece), in order
        self.index = self.audio = 0  # pieces and samples handed out
        self.first: float | None = None  # seconds to the first piece
        self.until: float | None = None  # when the audio handed out will have played
        self.n_tokens = self.n_chunks = 0
        self.cancelled = False
        self.windows: list[tuple[int, int]] = []
        self.spoken_sentence, self.spoken_to = -1, 0  # the text spans handed out (_span)

    # ---- the loop --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[AudioChunk]:
        ports = self.ports
        with ports.lock:
            self.batch = ports.batching.batch_for(self.r, pipeline.batch_width(self.r.models, ports.batch_width))
        if self.playing_until is not None and self.playing_until > time.perf_counter():  # (the caller's earlier
            self.until = self.playing_until  # audio, still playing: the plan counts it as in hand)
        try:
            for s in range(len(self.r.chunks)):
                sentence = self._start(s)
                while True:
                    if self.cancel is not None and self.cancel.is_set():
                        self.cancelled = True
                        sentence.tokens_gen.close()
                        return
                    tok = self._next_token(sentence)
                    if tok is not None and not self._cuts(sentence, tok):
                        yield from self._emit(False)
                        continue
                    yield from self._window(sentence, done=tok is None)
                    if tok is None:
                        break
                self.n_chunks += 1
        except GeneratorExit:
            self.cancelled = True
            raise
        except BaseException as exc:
            self.ports.stats.failure(exc)
            raise
        finally:
            self._finish()

    def _start(self, s: int) -> _Sentence:
        """Sentence ``s``'s start: its BERT (the first sentence's came with the request), its row in the decode
        batch (its prefill, unless it joined earlier) and its pacer."""
        r, rates, cfg = self.r, self.ports.rates, self.r.cfg
        chunk = r.chunks[s]
        stitcher = streaming.Stitcher(r.models.hop, r.speed, round(cfg.stream_crossfade_ms * self.sr / 1000))
        bank = self.ports.noise_bank((r.seed, s), r.models.prior_channels)
        with self._locked():
            missing = sum(len(c.phones) for c in r.chunks[s:] if c.bert is None) if chunk.bert is None else 0
            t0 = time.perf_counter()
            pipeline.fill_bert(r.chunks, s, r.spec, r.models, self.timer)
            t1 = time.perf_counter()
            row = r.rows.get(s)
            if row is None:  # its prefill, unless it joined earlier
                row = self.ports.batching.admit(r, s, self.timer)
                rates.note_start("prefill", time.perf_counter() - t1)
            if missing:
                rates.note_start("bert", t1 - t0, missing)
        gen = self.batch.tokens(row)
        waiting = self.until is None or self.until <= time.perf_counter()
        after = self._later_sentences(s) if self.options.plans_ahead(s, waiting) else []
        pacer = pacing.Pacer(cfg, rates, r.speed, streaming.vocoder_margin(r.models, cfg), stitcher.crossfade_frames,
                             stitcher.hop / self.sr, rates.expected_tokens(r.spec.name, len(chunk.phones)), after,
                             taper=s == 0, options=self.options, wait_since=self.t_start)
        return _Sentence(s, chunk, stitcher, bank, gen, pacer, lane_was_busy=self._lane_busy(),
                         steps=self.batch.steps, row_steps=self.batch.row_steps)

    def _next_token(self, sentence: _Sentence) -> int | None:
        """The sentence's next token (None: it ended), timed; a step of one row with nothing beside it measures the
        GPT's speed alone. A waiting sentence may join the decode before the token is kept."""
        batch = self.batch
        t0 = time.perf_counter()
        before = batch.steps, batch.row_steps, self._lane_busy()
        with self._locked(), stage("gpt"):
            tok = next(sentence.tokens_gen, None)
        dt = time.perf_counter() - t0
        self.timer.add("gpt_decode", dt)
        sentence.decode_s += dt
        if batch.steps == before[0] + 1 and not (before[2] or self._lane_busy()):  # one step, nothing beside
            self.ports.rates.note_step(batch.row_steps - before[1], dt)  # (one row: the GPT's speed alone, which
            # soon replaces a first request's batched steps, the stand-in)
        if tok is None:
            return None
        # a waiting sentence joins the decode when the listener has audio in hand, but not where the plan counts on
        # this sentence's steps alone (near real time: pacing.Pacer.covering; the later sentences then decode after
        # it, as the plan has them)
        pacer = sentence.pacer
        with self._locked():
            covering = pacer.covering and not self.options.join_while_covering
            self._admit_next(sentence, None if covering else self.until,
                             len(sentence.tokens) + 1 - sentence.cut_at)
            pacer.rows = min(batch.max_rows, len(batch.active))
        return int(tok)

    def _cuts(self, sentence: _Sentence, tok: int) -> bool:
        """Keep ``tok``; whether the pacer cuts a window now."""
        sentence.tokens.append(tok)
        self.n_tokens += 1
        new = len(sentence.tokens) - sentence.cut_at
        if not (sentence.lane_was_busy or self._lane_busy()) and solo(self.batch, sentence.steps, sentence.row_steps,
                                                                       new):
            sentence.pacer.live(sentence.decode_s, new)  # the speed this sentence's tokens have now
        return sentence.pacer.cut(new, time.perf_counter(), self.until)

    def _window(self, sentence: _Sentence, done: bool) -> Iterator[AudioChunk]:
        """Cut a window of the tokens since the last cut (``done``: the sentence's last), decode it and hand out
        the pieces that are ready (all of them where the plan needs them out now)."""
        r = self.r
        cut = self._measure_cut(sentence, done)
        with self._locked(), stage("sovits", self.timer, key="sovits_stream"):
            p = streaming.next_window(r.models, r.ref, sentence.chunk, r.cfg, sentence.stitcher, sentence.bank,
                                      sentence.tokens, done, self.lane if self._lane_now() else None)
        if p is not None:
            self._measure_window(sentence.pacer, p, *cut)
            self.pending.append((sentence.index, done, p))
        # a sentence's last pieces go out before the next sentence's start (BERT, prefill) where the listener has
        # little audio in hand: beside the lane's vocoder that start would slow it down
        short = self.until is None or self.until - time.perf_counter() <= overlap.SEND_BEFORE_NEXT_S
        yield from self._emit(self.lane is None or (done and (sentence.index == self.last or short)))

    def _measure_cut(self, sentence: _Sentence, done: bool) -> tuple[bool, bool, float, float]:
        """At a cut: the GPT's speed over the window's tokens where nothing ran beside them, the stream's batched
        step time for its pacer, the sentence's length once it ended; the sentence's window state starts anew.
        Returns (lane busy now, nothing beside the tokens, their GPT seconds, the plan's estimate of the window)."""
        rates, pacer = self.ports.rates, sentence.pacer
        busy = self._lane_busy()
        new = len(sentence.tokens) - sentence.cut_at
        alone = solo(self.batch, sentence.steps, sentence.row_steps, new)
        clean = not (busy or sentence.lane_was_busy or not alone)  # nothing beside it (which slows it down)
        if clean:  # the GPT's speed alone (beside the lane, slower)
            rates.note_tokens(sentence.decode_s, new)
        if not (busy or sentence.lane_was_busy) and new > 0:  # beside other rows a step is slower
            pacer.batched_token_s = 0.0 if alone else sentence.decode_s / new
        gpt_s = sentence.decode_s
        self.windows.append((sentence.index, new))
        estimate = pacer.estimate(new)  # (the plan's speeds at the cut)
        sentence.cut_at, sentence.decode_s, sentence.lane_was_busy = len(sentence.tokens), 0.0, busy
        if done:
            rates.note_length(self.r.spec.name, len(sentence.tokens), len(sentence.chunk.phones))
        sentence.steps, sentence.row_steps = self.batch.steps, self.batch.row_steps
        return busy, clean, gpt_s, estimate

    def _measure_window(self, pacer: pacing.Pacer, p: streaming.PendingPiece, busy: bool, clean: bool,
                        gpt_s: float, estimate: float) -> None:
        """A decoded window's SoVITS speeds where the lane was idle, and how far off the plan's estimate it was
        where nothing ran beside it."""
        rates = self.ports.rates
        if not busy:  # its speed alone
            rates.note_latent(p.latent_s, window=True)
            if p.vocode_s is not None:
                rates.note_vocoder(p.vocode_s, p.window.z.shape[2], window=True)
        if clean and pacer.paced and p.vocode_s is not None:  # how far off the plan was
            rates.note_window(gpt_s + p.latent_s + p.vocode_s, estimate)

    def _emit(self, block: bool) -> Iterator[AudioChunk]:
        """Yield the finished pieces in order (all of them when ``block``, else those ready now)."""
        cfg, sr = self.r.cfg, self.sr
        while self.pending and (block or self.pending[0][2].ready()):
            s, final, p = self.pending.popleft()
            with stage("sovits"):
                p.wait()  # the lane's vocoder run, outside the engine lock
            with self._locked(), stage("sovits"):
                piece, seconds = p.finish(self.r.models, self.r.ref)
            self.timer.add("sovits_stream", seconds)
            if final:
                piece = pipeline.postprocess(piece, sr, cfg.fragment_interval, normalise=False)
            now = time.perf_counter()
            if self.first is None:
                self.first = now - self.t_start
            self.until = max(now, self.until or now) + len(piece) / sr  # a player starts it on arrival
            span = self._span(s)
            yield AudioChunk(piece, sr, self.index, final and s == self.last, s, len(piece) / sr, *span, final)
            self.index += 1
            self.audio += len(piece)

    def _span(self, s: int) -> tuple[int, int]:
        """The text span sentence ``s``'s next piece carries: for its first piece, its sentence's (from where the
        last span handed out ended: a sentence that gave no audio goes with it), else an empty span there."""
        if s != self.spoken_sentence and s < len(self.r.spans):
            start = self.spoken_to
            self.spoken_sentence, self.spoken_to = s, self.r.spans[s][1]
            return start, self.spoken_to
        return self.spoken_to, self.spoken_to

    def _finish(self) -> None:
        """Drop the request's rows if it did not end, and record its counts and timings."""
        ports = self.ports
        if self.cancelled or self.n_chunks < len(self.r.chunks):
            with ports.lock:
                ports.batching.drop(self.r)  # its rows no longer step
        if self.first is not None:
            self.timer.add("time_to_first_audio", self.first)
        self.timer.add("total", time.perf_counter() - self.t_start)
        ports.stats.record(self.timer, self.audio / self.sr, self.n_tokens, self.n_chunks, stream=True)
        if self.cancelled:
            ports.stats.count("cancelled")
        with ports.lock:
            trim_after_request()  # the request's freed temporaries back to the OS (engine/store.py)

    # ---- the vocoder lane ------------------------------------------------------------------------
    def _lane_now(self) -> bool:
        """Whether the next window goes to the lane: only while the listener has enough audio queued, or while
        windows before it are still there. Beside the GPT a window is done later (the two share the cores), so
        the first audio, and any window the player may soon wait for, is vocoded in turn; the lane is for
        throughput once audio is buffered. Behind a busy lane a window vocoded in turn would only fight it for
        the cores and hold up the caller (pieces go out in order: it waits for the lane's anyway)."""
        if self.lane is None or self.until is None:
            return False
        if self.ports.follow_busy_lane and self._lane_busy():
            return True
        return self.until - time.perf_counter() > overlap.STREAM_QUEUED_S

    def _lane_busy(self) -> bool:
        """Whether a window is still in the lane (then the GPT and the caller's thread run slower)."""
        return any(not p.ready() for _, _, p in self.pending)

    # ---- the decode batch ------------------------------------------------------------------------
    def _later_sentences(self, s: int) -> list[tuple[int, float]]:
        """The pacer's view of the sentences after ``s``: (expected tokens, seconds before its first token: its
        prefill unless it has its row, and for the first of them the BERT the sentences still lack); empty where a
        length cannot be expected."""
        r, rates = self.r, self.ports.rates
        later, bert_phones = [], sum(len(c.phones) for c in r.chunks[s + 1:] if c.bert is None)
        for k in range(s + 1, len(r.chunks)):
            tokens = rates.expected_tokens(r.spec.name, len(r.chunks[k].phones))
            if tokens is None:
                return []
            start = 0.0 if k in r.rows else rates.start_s("prefill")
            if k == s + 1:
                start += rates.start_s("bert") * bert_phones
            later.append((tokens, start))
        return later

    def _admit_next(self, sentence: _Sentence, until: float | None, new_tokens: int) -> None:
        """Let one waiting sentence join the decode batch (its prefill, now).
        ``until`` None: none joins (queued texts cancelled since they joined still leave). One joins only where
        the sentence's pacer (``new_tokens`` since its last cut) keeps the listener fed after its start and with
        one more row in every step (:meth:`pacing.Pacer.admits`)."""
        r, rates, batching, head = self.r, self.ports.rates, self.ports.batching, sentence.index
        queued = None if until is None else until - time.perf_counter()

        def allows(j, s: int | None) -> bool:
            """Whether sentence ``s`` of ``j`` may join now (``j`` None: a queued text still to prepare, about as
            long as this sentence): its start by the measured speeds (front end aside), BERT where it lacks it, and
            its expected length (as long as it decodes, each step has one row more)."""
            chunk = r.chunks[head] if j is None else j.chunks[s]
            bert = rates.start_s("bert") * len(chunk.phones) if j is None or chunk.bert is None else 0.0
            tokens = rates.expected_tokens((r if j is None else j).spec.name, len(chunk.phones))
            rows = min(batching.batch.max_rows, len(batching.batch.active) + 1)
            return sentence.pacer.admits(new_tokens, time.perf_counter(), until, rates.start_s("prefill") + bert,
                                         rows, tokens)

        # which sentence joins: the next of this request without a row, else the first queued text's (prepared
        # here, once it may start), each only where ``allows``; the batching holds the data, this stream decides
        listed = batching.poll(self.listener.upcoming)
        if not batching.has_room(queued):
            return
        pick = None
        s = batching.open_sentence(r, head)
        if s is not None:
            pick = (r, s) if allows(r, s) else None
        else:
            for u in listed or ():
                if not batching.may_join(u):
                    continue
                j = batching.joined.get(u.key)
                if j is None:
                    if not allows(None, None):
                        break
                    j = batching.join(u, self.ports.prepare_joined(r, u))
                    if j is None:
                        continue
                s = batching.open_sentence(j.request)
                if s is not None:
                    pick = (j.request, s) if allows(j.request, s) else None
                    break
        if pick is not None:
            joined, s = pick
            batching.admit(joined, s, joined.timer or Timer())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The engine lock plus its device scope."""
        with self.ports.lock, self.ports.on_device():
            yield
