"""The engine's public face: :class:`GPTSoVITSEngine` — voices in, audio out.

It owns the request flow and nothing else: which voice (``voices``), what is loaded (one :class:`VoiceCache`
for models, encoders and reference features), one re-entrant lock that serialises model use (streams take
it per token and per window, so a stream consumed in one thread and a request from another interleave
safely), and the counters (:class:`EngineStats`). The recipe lives in ``pipeline`` (text -> tokens -> audio),
``reference`` (the voice's prompt side) and ``stream`` (one streamed request, handed what it uses of the engine as
one :class:`~.stream.EnginePorts`; its stages: ``batching``, ``pacing``, ``rates``, ``streaming``, ``overlap``).
It reproduces upstream ``TTS.run`` (docs/model.md, "End to end") with the choices :class:`GPTSoVITSEngine` lists."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np

from .. import _blas
from ..assets import catalog as voices_mod
from ..assets.catalog import VoiceSpec
from ..errors import ConfigError, SynthesisCancelled
from ..models.gpt.batch import DecodeBatch
from ..runtime import Runtime
from ..settings import Settings
from ..text import llm as llm_text
from ..text.options import TextData
from ..text.spans import piece_spans
from ..text.warmup import warm_up
from ..threads import ThreadPlan
from . import batching, overlap, pacing, pipeline
from .backends import backends
from .config import AudioChunk, SynthesisConfig, SynthesisResult
from .rates import StreamRates
from .reference import Reference
from .stats import EngineStats, Timer, stage
from .store import VoiceStore, release_memory, trim_after_request, voice_id
from .stream import NO_SCHEDULE, EnginePorts, Listener, Schedule, Stream

MODEL_KINDS = ("gpt", "sovits", "hubert", "bert", "sv")


@dataclasses.dataclass
class _Request:
    cfg: SynthesisConfig
    spec: VoiceSpec
    models: pipeline.Models
    ref: Reference
    chunks: list[pipeline.TextChunk]
    speed: float
    seed: int
    rows: dict = dataclasses.field(default_factory=dict)  # sentence -> its row in the decode batch (batching.py)
    timer: Timer | None = None  # the prepare's timings, for a queued text prepared ahead of its turn
    spans: list = dataclasses.field(default_factory=list)  # (start, end) of each chunk in the text (text.spans)


class GPTSoVITSEngine:
    """GPT-SoVITS v2 text-to-speech on MLX. Thread-safe: one lock serialises all model use.

    ``settings`` (default: read from the environment) give the model directory and the request defaults;
    ``runtime`` (default: :meth:`Runtime.from_settings`) says how the models run, resolved here once and handed
    to every loader. ``model_dir``, ``device`` and ``encoders``, when given, override the settings' and the
    runtime's.

    Choices against upstream ``TTS.run``:

    - Every text chunk is generated and SoVITS-decoded on its own (``batch_size`` 1, as the dora fork does for its
      1.1x voices, §10), so chunks are independent (streaming needs that); the GPT keeps the first token (HEAD).
    - Randomness is reproducible: the GPT sampler of chunk ``i`` is seeded with ``seed + i`` and the SoVITS prior
      noise of chunk ``i`` comes from a :class:`NoiseBank` seeded with ``(seed, i)``. ``seed=-1`` picks a seed.
    - Audio is float32 in [-1, 1]; each chunk is followed by ``fragment_interval`` seconds of silence.
    - ``cancel`` (a ``threading.Event``) stops a request between two GPT tokens and between stages (text/BERT,
      each sentence's SoVITS decode, each streamed window)."""

    def __init__(self, model_dir: str | Path | None = None, device: str | None = None, encoders: str | None = None,
                 config: SynthesisConfig | None = None, progress: Callable[[str], None] | None = None,
                 settings: Settings | None = None, runtime: Runtime | None = None):
        self.settings = settings if settings is not None else Settings.from_env()
        self.model_dir = Path(model_dir).expanduser() if model_dir else self.settings.model_dir
        runtime = runtime if runtime is not None else Runtime.from_settings(self.settings)
        if not isinstance(runtime, Runtime):
            raise ConfigError(f"runtime must be a Runtime, not {type(runtime).__name__}")
        device = {"metal": "gpu", "cuda": "gpu", "mps": "gpu"}.get(device, device) if device is not None else None
        given = {k: v for k, v in (("device", device), ("encoders", encoders)) if v is not None}
        if runtime.threads is None:  # the thread plan (threads.py): one per engine, from its settings
            given["threads"] = ThreadPlan.from_settings(self.settings)
        self.runtime = runtime.replace(**given) if given else runtime
        self.threads: ThreadPlan = self.runtime.threads.reach_blas(_blas.configure_threads, _blas.hold_one_thread)
        self.device = _pick_device(self.runtime.device)
        self.device_name = str(self.device if self.device is not None else mx.default_device())
        self.encoders = self.runtime.encoders  # CoreML on macOS ("auto"/"coreml"), MLX otherwise; see encoders.py
        self.text_data = TextData.from_settings(self.settings, self.model_dir)  # the text front end's folders, g2pW
        self.config = config if config is not None else SynthesisConfig()
        if not isinstance(self.config, SynthesisConfig):
            raise ConfigError(f"config must be a SynthesisConfig, not {type(self.config).__name__}")
        self.progress = progress
        self.voice: VoiceSpec | None = None
        self._stats = EngineStats()
        self.store = VoiceStore(self.runtime, self.model_dir, self.settings.max_cached_voices, self._stats, self._say,
                                self.settings.max_converted_models, self.text_data,
                                Path(self.settings.cache_dir) / "references" if self.settings.reference_cache else None,
                                Path(self.settings.cache_dir) / "prepared" if self.settings.prepared_cache else None)
        self.cache, self.references = self.store.cache, self.store.references
        self.noise_bank = pipeline.NoiseBank  # (seed, sentence), channels -> bank; tests replay noise here
        self._lock = threading.RLock()
        self._lane = overlap.VocoderLane(  # the vocoder beside the GPT (overlap.py); the plan keeps the kernels and
            on_busy=functools.partial(_lane_busy, self.threads, self.runtime.hold_blas))  # the BLAS to one thread
        self.pacing_plan: pacing.PacingOptions | None = None  # None: the settings' (pacing_options)
        self.rates = StreamRates()  # measured speeds: how a stream paces its windows (engine/rates.py, pacing.py)
        self.batching = batching.Batching()  # the GPT's decode batch and the queued texts that joined it

    # ---- voices and models -------------------------------------------------------------------------
    def _on_device(self):
        return mx.stream(self.device) if self.device is not None else contextlib.nullcontext()

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def _resolve(self, voice: str | VoiceSpec | None) -> VoiceSpec:
        if voice is None:
            if self.voice is None:
                raise ConfigError("no voice loaded: call load_voice(name) or pass voice=...")
            return self.voice
        if isinstance(voice, VoiceSpec):
            if voice != self.voice:  # the current voice is loaded (its files may be gone: it keeps serving)
                voices_mod.ensure_installed(voice, self.model_dir)  # missing files: VoiceNotInstalledError
            return voice
        if isinstance(voice, str):
            return voices_mod.resolve_voice(voice, self.model_dir, **voices_mod.catalog_options(self.settings))
        raise ConfigError(f"voice must be a name or a VoiceSpec, not {type(voice).__name__}")

    def load_voice(self, name_or_spec: str | VoiceSpec) -> VoiceSpec:
        """Make ``name_or_spec`` the current voice: load its models and compute its reference side. On any
        failure the previous voice stays current."""
        spec = self._resolve(name_or_spec)
        with self._lock, self._on_device():
            models = self.store.models(spec)
            self.store.reference(spec, models, self.config.prompt_lang or spec.prompt_lang, Timer())
            previous, self.voice = self.voice, spec
            self.cache.set_current(voice_id(spec))
            if previous is not None and voice_id(previous) != voice_id(spec):  # switching frees the old models
                self.batching.drop_joined()  # (and the queued texts that joined the old voice's decode)
                for kind in ("gpt", "sovits"):  # (files the new voice shares stay; its references stay cached)
                    self.cache.discard(kind, voice_id(previous))
        return spec

    # ---- requests ----------------------------------------------------------------------------------
    def _lane_for(self, models: pipeline.Models) -> overlap.VocoderLane | None:
        """The vocoder lane where it is wanted (``overlap.wanted``) and, under ``PRIMESPEECH_OVERLAP=auto``, the
        thread plan runs two or more threads now: where a co-tenant leaves one core, the lane's vocoder would only
        take turns with the GPT on it (and slow both)."""
        if self.runtime.overlap != "1" and self.threads.compute() < 2:
            return None
        return self._lane if overlap.wanted(self.runtime.overlap, models.sovits) else None

    def _prepare(self, text, voice, config, overrides, timer: Timer, cancel, bert_upto: int | None = None) -> _Request:
        cfg = (config if config is not None else self.config).replace(**overrides)
        spec = self._resolve(voice)
        models = self.store.models(spec)
        ref = self.store.reference(spec, models, cfg.prompt_lang or spec.prompt_lang or spec.language, timer)
        pipeline.check_cancel(cancel)
        lang = cfg.text_lang or spec.language
        if isinstance(text, str) and (self.settings.llm_text if cfg.llm_text is None else cfg.llm_text):
            text = llm_text.clean(text, lang)  # speak an LLM's prose, not its markup and reasoning
        bert_s = timer.timings.get("bert", 0.0)
        chunks = pipeline.text_chunks(text, lang, cfg.text_split_method, spec, models, timer, bert_upto,
                                      cancel, self.settings.max_text_seconds, data=self.text_data)
        bert_s = timer.timings.get("bert", 0.0) - bert_s  # (a stream's pacer counts it for its later sentences)
        self.rates.note_start("bert", bert_s, sum(len(c.phones) for c in chunks if c.bert is not None))
        speed = float(cfg.speed_factor if cfg.speed_factor is not None else spec.speed_factor)
        seed = cfg.seed if cfg.seed != -1 else secrets.randbelow(2**31)
        spans = piece_spans(text, [c.source for c in chunks]) if isinstance(text, str) else []
        return _Request(cfg, spec, models, ref, chunks, speed, seed, spans=spans)

    def synthesize(self, text: str, voice: str | VoiceSpec | None = None, config: SynthesisConfig | None = None,
                   cancel: threading.Event | None = None, *, max_tokens: int | None = None,
                   **overrides) -> SynthesisResult:
        """Speak ``text`` in one piece: float32 audio of all chunks, each followed by ``fragment_interval``
        seconds of silence (upstream ``audio_postprocess``). Setting ``cancel`` stops the work between two GPT
        tokens or two stages and raises :class:`SynthesisCancelled`. ``max_tokens``: each sentence speaks at most its
        first this many GPT tokens (the warm-up's cap; a sentence decoded in a batch is cut after decoding)."""
        t_start, timer = time.perf_counter(), Timer()
        with self._lock, self._on_device():
            self._stats.begin(stream=False)
            self.rates.use(self.threads.refresh())  # the cores free now (threads.py), and their speeds
            try:
                r = self._prepare(text, voice, config, overrides, timer, cancel)
                sr, lane = r.models.sample_rate, self._lane_for(r.models)
                width = pipeline.batch_width(r.models, self.settings.batch)
                batch = DecodeBatch(width) if width > 1 and len(r.chunks) > 1 else None  # this request's own
                latents, all_tokens = [], []  # per sentence: audio, or a future of the lane's vocoder run
                for i, chunk in enumerate(r.chunks):
                    quiet = not latents or lane is None  # no vocoder beside it (which slows everything down)
                    decoded, solo = timer.timings.get("gpt_decode", 0.0), True
                    if batch is None:
                        tokens = pipeline.generate_tokens(r.models, r.ref, chunk, r.cfg, r.seed + i, timer, cancel,
                                                          max_tokens)
                    else:  # the sentences after it decode beside it (continuous batching: same tokens)
                        tokens, solo = self._batched_tokens(r, batch, i, timer, cancel)
                        tokens = tokens[:max_tokens]
                    seconds = timer.timings.get("gpt_decode", 0.0) - decoded
                    self.rates.note_length(r.spec.name, len(tokens), len(chunk.phones))  # (streams' windows plan by it)
                    if quiet and (solo or (i == 0 and self.rates.token_s is None)):  # the speeds streams are
                        # paced by (engine/pacing.py). The first sentence's tokens each took a batched step, slower
                        # than a step alone: until one is measured, a cautious stand-in (a first stream is paced)
                        self.rates.note_tokens(seconds, len(tokens) - 1)
                    pipeline.check_cancel(cancel)
                    with stage("sovits", timer):
                        bank = self.noise_bank((r.seed, i), r.models.prior_channels)
                        t0 = time.perf_counter()
                        z = pipeline.sentence_latent(r.models, r.ref, tokens, chunk.phones, r.speed,
                                                     r.cfg.noise_scale, bank)
                        t1 = time.perf_counter()
                        if quiet:  # (whether its tokens were decoded in a batch or not)
                            self.rates.note_latent(t1 - t0, window=False)
                        if lane is not None:  # the GPT goes on with the next sentence meanwhile
                            latents.append((z, lane.submit(r.models.sovits.vocoder_backend, z, r.ref.ge)))
                        else:
                            latents.append((z, pipeline.vocode(r.models, r.ref, z)))
                            self.rates.note_vocoder(time.perf_counter() - t1, z.shape[2])
                    all_tokens.append(tokens)
                pieces = []
                for i, (z, audio) in enumerate(latents):
                    if not isinstance(audio, np.ndarray):
                        with stage("sovits"):  # (the lane's own seconds are what the stage took)
                            audio, seconds = audio.result()
                        timer.add("sovits", seconds)
                        if i == len(latents) - 1 and audio is not None:  # the last ran with the GPT idle
                            self.rates.note_vocoder(seconds, z.shape[2])
                    if audio is None:  # ONNX Runtime failed in the lane: MLX runs it, on this thread
                        with stage("sovits", timer):
                            audio = pipeline.vocode(r.models, r.ref, z)
                    pieces.append(pipeline.postprocess(audio, sr, r.cfg.fragment_interval))
            except SynthesisCancelled:
                self._stats.count("cancelled")
                raise
            except BaseException as exc:
                self._stats.failure(exc)
                raise
            audio = np.concatenate(pieces).astype(np.float32)
            tokens = np.concatenate(all_tokens).astype(np.int32)
            timer.add("total", time.perf_counter() - t_start)
            self._stats.record(timer, len(audio) / sr, len(tokens), len(r.chunks), stream=False)
            trim_after_request()  # the request's freed temporaries back to the OS (engine/store.py)
        return SynthesisResult(audio, sr, len(audio) / sr, tokens, timer.timings, r.spec.name)

    def _batched_tokens(self, r: _Request, batch: DecodeBatch, i: int, timer: Timer, cancel):
        """Sentence ``i``'s tokens from ``batch``, the sentences after it joining as rows free up; and whether they
        took a step alone each (their seconds are then the GPT's speed alone: :func:`batching.solo`)."""
        for j in range(i, len(r.chunks)):
            if j not in r.rows and batch.room > 0:
                batching.add_row(batch, r, j, timer)
        tokens: list[int] = []
        steps, rows = batch.steps, batch.row_steps
        gen = batch.tokens(r.rows[i])
        try:
            while True:
                pipeline.check_cancel(cancel)
                t0 = time.perf_counter()
                with stage("gpt"):
                    tok = next(gen, None)
                timer.add("gpt_decode", time.perf_counter() - t0)
                if tok is None:
                    return np.asarray(tokens, dtype=np.int32), batching.solo(batch, steps, rows, len(tokens))
                tokens.append(int(tok))
        except BaseException:
            for row in r.rows.values():
                batch.drop(row)
            raise

    def synthesize_stream(self, text: str, voice: str | VoiceSpec | None = None,
                          config: SynthesisConfig | None = None, cancel: threading.Event | None = None,
                          listener: Listener | None = None, *, key=None, upcoming=None,
                          playing_until: float | None = None, **overrides) -> Iterator[AudioChunk]:
        """Speak ``text`` as a stream of :class:`AudioChunk` produced while the GPT is still generating
        (:class:`~.stream.Stream`).

        Settings, voice and text are checked before this returns (errors raise here, not on the first
        ``next``). Setting ``cancel`` stops generation between two tokens or windows; no further chunk is
        yielded. Each sentence's last chunk carries the ``fragment_interval`` silence.

        ``listener`` (:class:`~.stream.Listener`, e.g. :class:`~.stream.Schedule`, or ``board.listener(key)`` of a
        :class:`~..board.Board` onto which a caller that keeps a queue pushes it and its playback clock as data, as
        the node does: the stream reads the board and never calls the caller): what the caller knows about the
        audio around this text. Continuous batching (``PRIMESPEECH_BATCH``, engine/batching.py): the text's
        later sentences, and the texts ``listener.upcoming()`` lists (:class:`~.batching.Upcoming`: those the
        caller will ask for next, in order), decode beside the sentence being spoken once enough audio is queued; a
        later call whose listener has the same ``key``, with the same text, voice and overrides, goes on from the
        tokens decoded. Every sentence's tokens are those of its decode alone with the same seed.

        ``listener.playing_until()``: when (``time.perf_counter()``) the audio the caller sent before this text
        will have played, where the same listener plays this one after it (the node's audio output): the stream's
        windows are then planned with that audio in hand, as a text's later sentences are (a larger first piece
        that keeps the rest in time, instead of a small one the listener would wait for after a gap). None, or a
        time passed: the listener waits for this text's first audio. Anything but a finite number or None raises
        ValueError here. ``key``, ``upcoming`` (a callable) and ``playing_until`` (a time) are the same, given
        apart (``Schedule(key, upcoming, playing_until)``); with ``listener`` they raise TypeError."""
        listener = _listener(listener, key, upcoming, playing_until)
        until = listener.playing_until()
        if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))
                                  or not math.isfinite(until)):
            raise ValueError(f"playing_until must be a time.perf_counter() value or None, got {until!r}")
        t_start, timer = time.perf_counter(), Timer()
        with self._lock, self._on_device():
            self._stats.begin(stream=True)
            self.rates.use(self.threads.refresh())  # the cores free now (threads.py), and their speeds
            try:
                r = self.batching.take(listener.key, text, voice, overrides)
                queued = listener.upcoming()
                if queued is None:
                    self.batching.drop_joined()  # no caller tells which joined texts are still wanted
                else:
                    self.batching.reconcile(queued)  # texts cancelled since they joined leave the batch
                if r is None:
                    r = self._prepare(text, voice, config, overrides, timer, cancel,
                                      bert_upto=self.pacing_options().bert_upto)
                else:
                    timer = r.timer or timer
                    pipeline.check_cancel(cancel)
            except SynthesisCancelled:
                self._stats.count("cancelled")
                return iter(())  # cancelled before the first chunk: an empty stream
            except BaseException as exc:
                self._stats.failure(exc)
                raise
        return iter(Stream(self._ports(r), r, timer, t_start, cancel, listener, until))

    def _ports(self, r: _Request) -> EnginePorts:
        """What request ``r``'s stream is given of the engine (:class:`~.stream.EnginePorts`): the stream reaches the
        engine through these alone."""
        return EnginePorts(self._lock, self._on_device, self._stats, self.rates, self.batching, self.settings.batch,
                           self.pacing_options(), self._lane_for(r.models), self.runtime.follow_busy_lane,
                           self.noise_bank, self._prepare_joined)

    def pacing_options(self) -> pacing.PacingOptions:
        """The plan a stream starting now follows: :attr:`pacing_plan` where set (tests, measuring tools), else the
        default plan with the start the settings choose (``PRIMESPEECH_STREAM_START``)."""
        if self.pacing_plan is not None:
            return self.pacing_plan
        return pacing.PacingOptions(start=self.settings.stream_start, max_wait_s=self.settings.stream_max_wait)

    def _prepare_joined(self, r: _Request, u: batching.Upcoming) -> _Request | None:
        """A queued text's request, prepared now to join ``r``'s decode batch; None when it cannot join (another
        voice or settings, or any error: its own call reports it)."""
        try:
            j = self._prepare(u.text, u.voice, None, dict(u.overrides), Timer(), u.cancel,
                              bert_upto=self.pacing_options().bert_upto)
        except Exception:  # noqa: BLE001 - its own synthesize_stream call raises it where it can be answered
            return None
        if j.models.gpt is not r.models.gpt or voice_id(j.spec) != voice_id(r.spec):
            return None
        j.timer = Timer()
        return j

    # ---- service -----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counts, audio and compute seconds, mean stage timings, the current voice, the cache and backends."""
        # Without the engine lock (a synthesis holds it for seconds): the counts, the cache and the rates have
        # their own locks, and the backends are read without loading anything.
        return {
            **self._stats.snapshot(),
            "cached_references": len(self.cache.keys("reference")),
            "loaded_models": sorted(f"{k[0]}:{Path(k[1][0]).name}" for k in self.cache.keys()
                                    if k[0] in MODEL_KINDS),
            "cached_voices": [v.split("|", 1)[0] for v in self.cache.voices()],
            "voice": self.voice.name if self.voice else None,
            "backends": backends(self),
            "stream_rates": self.rates.as_dict(),  # the speeds streams are paced by (engine/pacing.py)
            "decode_batch": self.batching.as_dict(),  # continuous batching (engine/batching.py)
        }

    def warmup(self, cancel: threading.Event | None = None) -> dict[str, float]:
        """Warm the GPT decode path, every text front end the voice's language may reach (for Chinese voices
        also English, which mixed text uses), then one short synthesis with the current voice, at most
        :func:`warmup_tokens` tokens (loads and caches everything, compiles, and measures the speeds streams are paced
        by). Returns the front ends' warm-up seconds by language.

        ``cancel`` set (before or during it: the node sets it when a text arrives) cuts the synthesis short at its
        next checkpoint, or skips it: the first text is then spoken at once and measures the speeds itself, as
        with ``GPTSVITS_WARMUP=false``."""
        spec = self._resolve(None)
        text = "你好。" if spec.language in ("zh", "all_zh") else "Hello."
        with self._lock, self._on_device():
            models = self.store.models(spec)
            models.gpt.decoder.warmup()  # numpy views (CPU) / compiled decode buckets (GPU)
            with stage("text"):
                front_ends = warm_up(self.config.text_lang or spec.language, models.symbol_version,
                                     data=self.text_data)
            if "zh" in front_ends:  # Chinese text needs RoBERTa: loaded now even when the synthesis is skipped
                models.encoders.load(("bert",))  # (the reference features may have come from the disk cache)
        with self._lock, self._stats.paused():
            try:
                self.synthesize(text, fragment_interval=0.0, cancel=cancel, max_tokens=warmup_tokens(self.config))
            except SynthesisCancelled:
                pass  # a text is waiting: it is the warm-up
        return front_ends

    def cleanup(self) -> dict:
        """Free what the current voice does not use: other voices' models, reference features and encoders.
        Returns what was dropped (the node's ``cleanup`` control command)."""
        with self._lock:
            dropped = self.cache.keep_only(voice_id(self.voice) if self.voice else None)
            release_memory()
        models = sum(n for kind, n in dropped.items() if kind in MODEL_KINDS)
        return {"models": models, "references": dropped.get("reference", 0), "encoders": dropped.get("encoders", 0)}

    def list_voices(self) -> list[dict]:
        return [dataclasses.asdict(v) for v in voices_mod.list_voices(self.model_dir,
                                                                      **voices_mod.catalog_options(self.settings))]


def warmup_tokens(config: SynthesisConfig) -> int:
    """The most GPT tokens the warm-up synthesis speaks: a stream's largest window with its context and lookahead (60
    by default), so that each stage runs once and the speeds measured on a whole sentence stay no lower than a
    window's (the pacer's estimate until windows are measured, engine/rates.py), while a voice whose short text runs
    long (the bench's: 100 tokens) is not decoded whole (docs/performance.md, "Start-up")."""
    return config.stream_chunk_tokens + config.stream_context_tokens + config.stream_lookahead_tokens


def _listener(listener: Listener | None, key, upcoming, playing_until) -> Listener:
    """``synthesize_stream``'s listener: ``listener``, or one made of the separate ``key`` / ``upcoming`` /
    ``playing_until`` keywords (not both)."""
    if listener is None:
        if key is None and upcoming is None and playing_until is None:
            return NO_SCHEDULE
        return Schedule(key, upcoming, playing_until)
    if key is not None or upcoming is not None or playing_until is not None:
        raise TypeError("synthesize_stream: pass listener= or key= / upcoming= / playing_until=, not both")
    return listener


def _lane_busy(plan: ThreadPlan, hold_blas: bool, busy: bool) -> None:
    """While the vocoder lane works, the GPT's float16 kernels and (``hold_blas``, the runtime's) the BLAS (MLX's
    matrix products: BERT, the prefill, the text encoder and flow) keep to one thread: the other cores are the
    lane's (engine/overlap.py). The engine's thread plan holds that state (threads.py)."""
    plan.lane(busy, hold_blas)


def _pick_device(device: str) -> mx.Device | None:
    if device == "auto":
        return None
    if device == "cpu":
        return mx.Device(mx.cpu)
    if device in ("gpu", "metal", "cuda"):
        if not mx.is_available(mx.gpu):
            raise ConfigError(f"device={device!r} was requested but this MLX build has no GPU backend")
        return mx.Device(mx.gpu)
    raise ConfigError(f"device={device!r} is invalid: use 'auto', 'cpu' or 'gpu'")
