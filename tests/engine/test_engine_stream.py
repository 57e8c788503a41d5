"""GPTSoVITSEngine.synthesize_stream: audio comes out while the GPT is still generating, the stream
matches the whole-utterance audio, its seams are smooth, and cancel stops generation between tokens.

The seam logic (Stitcher) is also checked on a synthetic smooth signal, where a missing crossfade
would show as a jump (the fixture models' audio is noise-like, so jumps there say little).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from test_engine import GenerateSpy, case, model_dir, voice  # noqa: F401  (shared fixtures)
from test_engine import engine as engine  # noqa: F401,F811

from dora_primespeech_mlx.engine import AudioChunk
from dora_primespeech_mlx.engine.streaming import Stitcher
from dora_primespeech_mlx.errors import NothingToSpeakError

TEXT = "Hello world, this is a small test."
GREEDY = {"text_split_method": "cut0", "top_k": 1, "seed": 7}


@pytest.fixture(scope="module")
def text_tokens(engine) -> int:
    """How many tokens the tiny GPT speaks for TEXT with GREEDY (the fixture set's GPT decides: it stops at its
    EOS or at 50 * max_sec tokens)."""
    n = len(engine.synthesize(TEXT, speed_factor=1.0, **GREEDY).semantic_tokens)
    assert n >= 8, f"the fixture GPT speaks {n} tokens for {TEXT!r}: too few for a stream of several windows"
    return n


@pytest.fixture(scope="module")
def small(text_tokens) -> dict:
    """Small windows scaled to TEXT's tokens so that its one sentence gives several seams: the first window after
    a quarter of them, later ones growing to a fifth; fixed steps (pacing has its own tests)."""
    chunk = max(2, text_tokens // 5)
    return {"stream_first_tokens": max(2, text_tokens // 4), "stream_chunk_tokens": chunk,
            "stream_context_tokens": min(8, chunk), "stream_lookahead_tokens": min(3, chunk - 1), **GREEDY,
            "stream_pace": False}


def _collect(stream, events=None) -> list[AudioChunk]:
    out = []
    for c in stream:
        if events is not None:
            events.append(("chunk", c.chunk_index))
        out.append(c)
    return out


def test_first_audio_before_generation_ends(engine, small, monkeypatch):

    # the vocoder in turn with the GPT (with PRIMESPEECH_OVERLAP the chunk comes when the lane is done)
    monkeypatch.setattr(engine, "runtime", engine.runtime.replace(overlap="0"))
    spy = GenerateSpy(monkeypatch)
    chunks = _collect(engine.synthesize_stream(TEXT, **small), spy.events)
    events = spy.events
    tokens = [i for i, e in enumerate(events) if e[0] == "token"]
    first_chunk = next(i for i, e in enumerate(events) if e[0] == "chunk")
    assert first_chunk < tokens[-1], "the first chunk must be yielded while tokens are still produced"
    # it came right after the configured number of tokens
    assert sum(1 for e in events[:first_chunk] if e[0] == "token") == small["stream_first_tokens"]
    assert len(chunks) >= 3
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert [c.is_final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all(c.sentence_index == 0 and c.sample_rate == 32000 for c in chunks)
    assert all(c.audio.dtype == np.float32 and c.duration == len(c.audio) / 32000 for c in chunks)
    st = engine.stats()
    assert st["streams"] >= 1 and st["mean_timings"]["time_to_first_audio"] > 0


def _seams(chunks) -> np.ndarray:
    return np.cumsum([len(c.audio) for c in chunks])[:-1]


def _rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_stream_matches_whole_utterance(engine, small):
    """Same seed and greedy tokens: the streamed audio equals the whole decode up to the context
    effects of the window decodes. Metric: relative L2 error of the speech part (a misaligned,
    repeated or missing piece gives ~1 or more on this noise-like audio)."""
    whole = engine.synthesize(TEXT, speed_factor=1.0, **GREEDY)
    chunks = _collect(engine.synthesize_stream(TEXT, speed_factor=1.0, **small))
    streamed = np.concatenate([c.audio for c in chunks])
    gap = int(0.3 * 32000)
    assert len(streamed) == len(whole.audio)
    assert not streamed[-gap:].any(), "the sentence ends with fragment_interval of silence"
    rel = _rel_error(streamed[:-gap], whole.audio[:-gap])
    print(f"{len(chunks)} chunks, relative L2 error streamed vs whole {rel:.3f}")
    assert rel < 0.3
    # no seam makes a bigger step than the whole utterance has anywhere
    jumps = np.abs(np.diff(streamed))
    limit = np.abs(np.diff(whole.audio)).max()
    for b in _seams(chunks):
        assert jumps[max(0, b - 700) : b + 700].max() <= limit * 1.05


def test_stream_with_speed_factor(engine, small):
    """speed != 1: every window is resampled onto one output grid, so streamed pieces agree with a
    single-window stream of the same sentence; the length is upstream's int(2T/speed)+1 frames."""
    kw = {**small, "speed_factor": 1.1, "fragment_interval": 0.0}
    whole = engine.synthesize(TEXT, **{k: kw[k] for k in ("text_split_method", "top_k", "seed", "speed_factor")},
                              fragment_interval=0.0)
    one = np.concatenate([c.audio for c in engine.synthesize_stream(TEXT, **{**kw, "stream_first_tokens": 1500})])
    chunks = _collect(engine.synthesize_stream(TEXT, **kw))
    streamed = np.concatenate([c.audio for c in chunks])
    assert len(chunks) >= 3
    assert len(streamed) == len(one) == len(whole.audio) == (int(2 * len(whole.semantic_tokens) / 1.1) + 1) * 640
    rel = _rel_error(streamed, one)
    print(f"speed 1.1: {len(chunks)} chunks, relative L2 error vs one window {rel:.3f}")
    assert rel < 0.3


def _smooth_decoder(sr: int, hop: int, offsets):
    """A fake window decoder: a 150 Hz sine at absolute time plus an offset that differs per window
    (the decode of a window differs slightly from the next one), 2 * 640 samples per token."""
    t_abs = np.arange(200 * 2 * hop) / sr
    signal = 0.5 * np.sin(2 * np.pi * 150 * t_abs).astype(np.float32)

    def decode(start: int, n: int) -> np.ndarray:
        a = start * 2 * hop
        return signal[a : a + n * 2 * hop] + next(offsets)

    return signal, decode


@pytest.mark.parametrize("crossfade", [480, 0])
def test_stitcher_seams_are_smooth(crossfade):
    sr, hop, total = 32000, 640, 60
    offsets = iter([0.0, 0.04, -0.04, 0.03, -0.02, 0.04, 0.0, 0.02] * 4)
    signal, decode = _smooth_decoder(sr, hop, offsets)
    st = Stitcher(hop, 1.0, crossfade)
    pieces, n, context, lookahead = [], 0, 5, 2
    while n < total:
        n = min(total, n + 9)
        done = n == total
        stop = n if done else n - lookahead
        start = max(0, st.done_tokens - context)
        pieces.append(st.piece(decode(start, n - start), start, stop, done))
    out = np.concatenate(pieces)
    assert len(out) == total * 2 * hop
    natural = np.abs(np.diff(signal)).max()
    worst = np.abs(np.diff(out)).max()
    assert np.abs(out - signal[: len(out)]).max() <= 0.04 + 1e-6
    if crossfade:
        assert worst <= natural * 1.1, f"seam step {worst:.4f} vs signal's own {natural:.4f}"
    else:  # the negative control: without a crossfade the offsets show up as steps
        assert worst > natural * 1.3


def test_cancel_stops_between_tokens(engine, small, text_tokens, monkeypatch):
    spy = GenerateSpy(monkeypatch)
    cancel = threading.Event()
    before = engine.stats()["cancelled"]
    got = []
    for c in engine.synthesize_stream(TEXT, cancel=cancel, **small):
        got.append(c)
        cancel.set()
        n_tokens = len([e for e in spy.events if e[0] == "token"])
    assert len(got) == 1
    assert len([e for e in spy.events if e[0] == "token"]) == n_tokens, "no token after cancel"
    assert n_tokens < text_tokens
    assert engine.stats()["cancelled"] == before + 1

    cancel_now = threading.Event()
    cancel_now.set()
    assert list(engine.synthesize_stream(TEXT, cancel=cancel_now, **small)) == []


def test_cancel_from_another_thread(engine, small):
    cancel = threading.Event()
    got = []
    for c in engine.synthesize_stream("Hello world. This is a test. One more sentence here.", cancel=cancel, **small):
        got.append(c)
        if len(got) == 1:
            threading.Thread(target=cancel.set).start()
            threading.Event().wait(0.2)
    assert not got[-1].is_final


def test_stream_errors_raise_at_the_call(engine):
    with pytest.raises(NothingToSpeakError):
        engine.synthesize_stream("。。。")


def test_several_sentences_each_end_with_silence(engine, small):
    text = "Hello world. This is a test!"
    chunks = _collect(engine.synthesize_stream(text, **{**small, "text_split_method": "cut5"}))
    sentences = sorted({c.sentence_index for c in chunks})
    assert sentences == [0, 1]
    gap = int(0.3 * 32000)
    for s in sentences:
        last = [c for c in chunks if c.sentence_index == s][-1]
        assert len(last.audio) >= gap and not last.audio[-gap:].any()
    assert chunks[-1].is_final and sum(c.is_final for c in chunks) == 1


def test_window_steps_ramp_up_to_the_chunk():
    from dora_primespeech_mlx.engine import SynthesisConfig
    from dora_primespeech_mlx.engine.pacing import window_steps

    def first(n, **kw):
        steps = window_steps(SynthesisConfig(**kw))
        return [next(steps) for _ in range(n)]

    assert first(7, stream_first_tokens=12, stream_chunk_tokens=40, stream_ramp=1.5) == [12, 9, 14, 21, 31, 40, 40]
    assert first(4, stream_first_tokens=12, stream_chunk_tokens=40, stream_ramp=1) == [12, 40, 40, 40]
    assert first(4, stream_first_tokens=30, stream_chunk_tokens=20, stream_ramp=2) == [30, 20, 20, 20]


def _stream_audio(engine, small, **kw) -> np.ndarray:
    return np.concatenate([c.audio for c in engine.synthesize_stream(TEXT, **small, **kw)])


@pytest.mark.parametrize("speed", [1.0, 1.1])
def test_vocoder_crop_keeps_the_samples(engine, small, monkeypatch, speed):
    """Windows are vocoded only over the emitted frames plus the vocoder's receptive field: the audio equals
    vocoding each whole window (float rounding), while a crop without that margin changes it."""
    from dora_primespeech_mlx.models.sovits.hifigan import Generator

    cropped = _stream_audio(engine, small, speed_factor=speed, stream_vocoder_margin=4096)  # the whole receptive field
    monkeypatch.setattr(Generator, "receptive_frames", property(lambda self: 10**6))
    whole_windows = _stream_audio(engine, small, speed_factor=speed, stream_vocoder_margin=4096)  # whole windows
    assert cropped.shape == whole_windows.shape
    peak = float(np.abs(whole_windows).max())
    assert float(np.abs(cropped - whole_windows).max()) <= 1e-5 * peak
    monkeypatch.setattr(Generator, "receptive_frames", property(lambda self: 0))
    too_tight = _stream_audio(engine, small, speed_factor=speed, stream_vocoder_margin=4096)
    assert float(np.abs(too_tight - whole_windows).max()) > 1e-3 * peak  # the margin is what keeps it exact


def test_default_vocoder_margin_is_small_beside_the_windowing(engine, small):
    """``stream_vocoder_margin`` (default 5 frames, under v2's 13-frame receptive field) trades exactness for
    cheaper windows: the change it makes to the streamed audio is small beside the one streaming makes anyway
    (windows decoded with limited context, vs the whole sentence), and smaller than with no margin at all."""
    whole = engine.synthesize(TEXT, speed_factor=1.0, **GREEDY)
    speech = len(whole.audio) - int(0.3 * 32000)
    exact = _stream_audio(engine, small, speed_factor=1.0, stream_vocoder_margin=4096)[:speech]
    default = _stream_audio(engine, small, speed_factor=1.0)[:speech]
    bare = _stream_audio(engine, small, speed_factor=1.0, stream_vocoder_margin=0)[:speech]
    windowing = _rel_error(exact, whole.audio[:speech])
    margin = _rel_error(default, exact)
    print(f"relative L2: streamed vs whole {windowing:.3g}, default margin vs exact {margin:.3g}, "
          f"no margin vs exact {_rel_error(bare, exact):.3g}")
    assert margin <= 0.05 * windowing
    assert _rel_error(bare, exact) > margin


def test_receptive_frames_is_the_generator_reach(engine):
    """A crop of the latent with ``receptive_frames`` extra frames on each side vocodes to the same interior
    samples as the whole latent (the figure is a conservative bound: real v2 weights are exact from 12 of its
    13 frames on); half of it is not."""
    import mlx.core as mx

    from dora_primespeech_mlx.engine.stats import Timer

    models = engine.store.models(engine.voice)
    sovits = models.sovits
    hop, m = sovits.samples_per_frame, sovits.dec.receptive_frames
    ge = engine.store.reference(engine.voice, models, engine.voice.prompt_lang, Timer()).ge
    rng = np.random.default_rng(3)
    z = mx.array(rng.standard_normal((1, sovits.args.inter_channels, 4 * m + 20)).astype(np.float32))
    full = np.array(sovits.vocode(z, ge)).reshape(-1)
    a, b = 2 * m, 2 * m + 20

    def interior(margin):
        part = np.array(sovits.vocode(z[:, :, a - margin : b + margin], ge)).reshape(-1)
        return part[margin * hop : (margin + b - a) * hop]

    peak = float(np.abs(full).max())
    assert np.abs(interior(m) - full[a * hop : b * hop]).max() <= 1e-5 * peak
    assert np.abs(interior(m // 2) - full[a * hop : b * hop]).max() > 1e-6 * peak


@pytest.mark.parametrize("stream", [False, True])
def test_vocoder_beside_the_gpt_gives_the_same_audio(engine, small, monkeypatch, stream):
    """PRIMESPEECH_OVERLAP: the vocoder on the lane's worker thread (while the GPT goes on) yields the same
    chunks and samples as running it in turn, for whole and streamed requests of several sentences."""

    from dora_primespeech_mlx.engine import overlap

    sovits = engine.store.models(engine.voice).sovits
    if getattr(sovits, "vocoder_backend", None) is None or sovits.vocoder_backend.active != "onnxruntime":
        pytest.skip("the vocoder does not run on ONNX Runtime here (MLX on a GPU, or onnxruntime missing)")
    text = "Hello world. This is a small test. And a third one."
    kw = dict(small, text_split_method="cut5")
    monkeypatch.setattr(overlap, "STREAM_QUEUED_S", -1.0)  # every window after the first to the lane
    runs, real_submit = {}, overlap.VocoderLane.submit
    for mode in ("0", "1"):
        monkeypatch.setattr(engine, "runtime", engine.runtime.replace(overlap=mode))
        submitted = []
        monkeypatch.setattr(overlap.VocoderLane, "submit",
                            lambda self, *a, _seen=submitted: _seen.append(1) or real_submit(self, *a))
        if stream:
            chunks = list(engine.synthesize_stream(text, **kw))
            runs[mode] = ([(c.chunk_index, c.sentence_index, c.is_final) for c in chunks],
                          np.concatenate([c.audio for c in chunks]), len(submitted))
        else:
            runs[mode] = (None, engine.synthesize(text, **kw).audio, len(submitted))
    assert runs["0"][2] == 0 and runs["1"][2] > 0  # the lane was used only when asked
    assert runs["0"][0] == runs["1"][0]
    np.testing.assert_array_equal(runs["0"][1], runs["1"][1])


def test_stream_first_audio_waits_for_one_sentences_bert(engine, small, monkeypatch):
    """A stream computes the first sentence's BERT with the request and the others' after its first audio (one
    batch); a whole request batches all sentences at once."""
    from dora_primespeech_mlx.engine import pacing, pipeline

    calls, real = [], pipeline.bert_features
    monkeypatch.setattr(pipeline, "bert_features", lambda results, *a: calls.append(len(results)) or real(results, *a))
    text = "Hello world. This is a small test. And a third one."  # (the fixture BERT may not fit Chinese)
    kw = dict(small, text_split_method="cut5")
    stream = engine.synthesize_stream(text, **kw)
    assert calls == [1]
    first = next(stream)
    assert calls == [1] and first.sentence_index == 0
    rest = list(stream)
    sentences = 1 + max(c.sentence_index for c in rest)
    assert sentences >= 3 and calls == [1, sentences - 1]
    calls.clear()
    engine.synthesize(text, **kw)
    assert calls == [sentences]
    calls.clear()  # a plan without bert_first: every sentence's BERT before the stream starts
    monkeypatch.setattr(engine, "pacing_plan", pacing.PacingOptions(bert_first=False))
    stream = engine.synthesize_stream(text, **kw)
    assert calls == [sentences]
    list(stream)
    assert calls == [sentences]


@pytest.mark.parametrize("stream", [False, True])
def test_lane_falls_back_to_mlx_when_onnx_runtime_fails(engine, small, monkeypatch, stream):
    """ONNX Runtime failing inside the lane: one warning, MLX runs that vocoder on the caller's thread and
    from then on; the request completes with the same audio as MLX alone (within float rounding)."""

    sovits = engine.store.models(engine.voice).sovits
    backend = getattr(sovits, "vocoder_backend", None)
    if backend is None or backend.active != "onnxruntime":
        pytest.skip("the vocoder does not run on ONNX Runtime here (MLX on a GPU, or onnxruntime missing)")
    from dora_primespeech_mlx.engine import overlap

    text = "Hello world. This is a small test."
    kw = dict(small, text_split_method="cut5")
    monkeypatch.setattr(overlap, "STREAM_QUEUED_S", -1.0)  # every window after the first to the lane

    def run():
        if stream:
            return np.concatenate([c.audio for c in engine.synthesize_stream(text, **kw)])
        return engine.synthesize(text, **kw).audio

    monkeypatch.setattr(engine, "runtime", engine.runtime.replace(overlap="1"))
    generator = backend.generator
    monkeypatch.setattr(backend, "error", backend.error)  # restored after the test, like the generator
    monkeypatch.setattr(backend, "split", backend.split)
    monkeypatch.setattr(backend, "generator", None)  # MLX alone, for the reference audio
    mlx_audio = run()
    threads = []

    def broken(z, ge):
        import threading

        name = threading.current_thread().name
        if stream and not name.startswith("primespeech-vocoder"):  # a stream's first window runs in turn
            return generator(z, ge)
        threads.append(name)
        raise RuntimeError("injected onnxruntime failure")

    monkeypatch.setattr(backend, "split", None)  # (the stretches would call the real session)
    monkeypatch.setattr(backend, "generator", _Callable(broken, generator))
    audio = run()
    assert threads and threads[0].startswith("primespeech-vocoder")  # it failed in the lane
    assert backend.generator is None and "injected" in (backend.error or "")
    assert audio.shape == mlx_audio.shape
    assert np.abs(audio - mlx_audio).max() <= 1e-4 * max(1.0, float(np.abs(mlx_audio).max()))


class _Callable:
    """Stands in for the ONNX Runtime generator: calls ``fn``; describes itself like the real one."""

    def __init__(self, fn, real):
        self.fn, self.real, self.threads = fn, real, getattr(real, "threads", 1)

    def __call__(self, z, ge):
        return self.fn(z, ge)

    def describe(self):
        return self.real.describe()


def test_stream_uses_the_lane_only_with_audio_queued(engine, small, monkeypatch):
    """A stream's first window, and any window while less than STREAM_QUEUED_S of sent audio is unplayed, is
    vocoded in turn; with a large threshold the lane is never used, with a negative one every later window."""

    from dora_primespeech_mlx.engine import overlap

    sovits = engine.store.models(engine.voice).sovits
    if getattr(sovits, "vocoder_backend", None) is None or sovits.vocoder_backend.active != "onnxruntime":
        pytest.skip("the vocoder does not run on ONNX Runtime here (MLX on a GPU, or onnxruntime missing)")
    monkeypatch.setattr(engine, "runtime", engine.runtime.replace(overlap="1"))
    submitted, real_submit = [], overlap.VocoderLane.submit
    monkeypatch.setattr(overlap.VocoderLane, "submit", lambda self, *a: submitted.append(1) or real_submit(self, *a))
    counts = {}
    for threshold in (1e9, -1.0):
        monkeypatch.setattr(overlap, "STREAM_QUEUED_S", threshold)
        submitted.clear()
        chunks = list(engine.synthesize_stream(TEXT, **small))
        counts[threshold] = len(submitted)
    assert counts[1e9] == 0
    assert counts[-1.0] == len(chunks) - 1  # all windows but the first


class _Once:
    """A threshold that the first comparison passes and every later one fails (``queued > _Once()``)."""

    def __init__(self):
        self.used = False

    def __lt__(self, queued):
        first, self.used = not self.used, True
        return first


def test_lane_waits_while_the_thread_plan_has_one_thread(engine, small, monkeypatch):
    """PRIMESPEECH_OVERLAP=auto: while the thread plan runs one thread (a co-tenant took the other cores), every
    window is vocoded in turn (the lane would only take turns with the GPT on the one core); with two threads the
    lane takes the windows it is given, as ``overlap.wanted`` says."""
    from dora_primespeech_mlx.engine import overlap

    sovits = engine.store.models(engine.voice).sovits
    if getattr(sovits, "vocoder_backend", None) is None or sovits.vocoder_backend.active != "onnxruntime":
        pytest.skip("the vocoder does not run on ONNX Runtime here (MLX on a GPU, or onnxruntime missing)")
    monkeypatch.setattr(engine, "runtime", engine.runtime.replace(overlap="auto"))
    monkeypatch.setattr(overlap, "wanted", lambda mode, sovits: True)  # (as on two or more cores)
    monkeypatch.setattr(overlap, "STREAM_QUEUED_S", -1.0)  # every window after the first to the lane, if used
    submitted, real_submit = [], overlap.VocoderLane.submit
    monkeypatch.setattr(overlap.VocoderLane, "submit", lambda self, *a: submitted.append(1) or real_submit(self, *a))
    counts = {}
    for threads in (1, 2):
        monkeypatch.setattr(engine.threads, "refresh", lambda force=False, n=threads: n)
        monkeypatch.setattr(engine.threads, "compute", lambda n=threads: n)
        submitted.clear()
        assert list(engine.synthesize_stream(TEXT, **small))
        counts[threads] = len(submitted)
    assert counts[1] == 0 and counts[2] > 0, counts


@pytest.mark.parametrize("follow", [True, False])
def test_stream_windows_follow_a_busy_lane(engine, small, monkeypatch, follow):
    """While a stream's earlier window is still in the lane, its next windows go there too (they go out in order:
    vocoded in turn they would wait for it anyway, beside it and holding up the caller); the same audio either
    way. With the runtime's follow_busy_lane off only the audio queued decides."""

    from dora_primespeech_mlx.engine import overlap, streaming

    sovits = engine.store.models(engine.voice).sovits
    backend = getattr(sovits, "vocoder_backend", None)
    if backend is None or backend.active != "onnxruntime":
        pytest.skip("the vocoder does not run on ONNX Runtime here (MLX on a GPU, or onnxruntime missing)")
    monkeypatch.setattr(engine, "runtime", engine.runtime.replace(overlap="1", follow_busy_lane=follow))
    text = "Hello world. This is a small test. And a third one."
    kw = dict(small, text_split_method="cut5")
    monkeypatch.setattr(overlap, "STREAM_QUEUED_S", 1e9)
    alone = list(engine.synthesize_stream(text, **kw))  # every window in turn
    # the lane's first run waits until the stream has cut its last window: the lane is busy for all later ones
    cut, all_cut, real_next = [], threading.Event(), streaming.next_window

    def next_window(*a, **k):
        p = real_next(*a, **k)
        if p is not None:
            cut.append(1)
            if len(cut) == len(alone):
                all_cut.set()
        return p

    monkeypatch.setattr(streaming, "next_window", next_window)
    submitted, real_submit = [], overlap.VocoderLane.submit
    monkeypatch.setattr(overlap.VocoderLane, "submit", lambda self, *a: submitted.append(1) or real_submit(self, *a))
    real_run, lane_runs = type(backend).run_onnx, []

    def run_onnx(self, z, ge):
        if threading.current_thread().name.startswith("primespeech-vocoder"):  # (in turn: the caller's thread)
            lane_runs.append(1)
            if len(lane_runs) == 1:
                all_cut.wait(30)
        return real_run(self, z, ge)

    monkeypatch.setattr(type(backend), "run_onnx", run_onnx)
    monkeypatch.setattr(overlap, "STREAM_QUEUED_S", _Once())  # only the first window after the first audio
    monkeypatch.setattr(overlap, "SEND_BEFORE_NEXT_S", -1.0)  # (no sentence's end waits for the lane here)
    chunks = list(engine.synthesize_stream(text, **kw))
    assert all_cut.is_set()
    assert len(submitted) == (len(chunks) - 1 if follow else 1)
    assert [(c.chunk_index, c.sentence_index, c.is_final) for c in chunks] == [
        (c.chunk_index, c.sentence_index, c.is_final) for c in alone]
    np.testing.assert_array_equal(np.concatenate([c.audio for c in chunks]), np.concatenate([c.audio for c in alone]))


@pytest.mark.parametrize("send_first", [True, False])
def test_a_sentence_s_last_pieces_go_out_before_the_next_sentence_s_start(engine, small, monkeypatch, send_first):
    """At a sentence's end with little audio in hand (SEND_BEFORE_NEXT_S), the stream waits for its pieces still in
    the lane and sends them before the next sentence's start (BERT, prefill), which beside the lane's vocoder would
    slow it down; with the threshold below zero the next sentence starts while they are still there. The same
    audio either way."""

    from dora_primespeech_mlx.engine import batching, overlap

    sovits = engine.store.models(engine.voice).sovits
    backend = getattr(sovits, "vocoder_backend", None)
    if backend is None or backend.active != "onnxruntime":
        pytest.skip("the vocoder does not run on ONNX Runtime here (MLX on a GPU, or onnxruntime missing)")
    monkeypatch.setattr(engine, "runtime", engine.runtime.replace(overlap="1"))
    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", float("inf"))  # each sentence starts at its turn
    text = "Hello world. This is a small test."
    kw = dict(small, text_split_method="cut5")
    alone = list(engine.synthesize_stream(text, **kw))
    monkeypatch.setattr(overlap, "STREAM_QUEUED_S", -1.0)  # every window after the first goes to the lane
    monkeypatch.setattr(overlap, "SEND_BEFORE_NEXT_S", 1e9 if send_first else -1.0)
    real_run = type(backend).run_onnx

    def slow_lane(self, z, ge):  # the lane's runs take long enough for the next sentence to start beside them
        if threading.current_thread().name.startswith("primespeech-vocoder"):
            time.sleep(0.3)
        return real_run(self, z, ge)

    monkeypatch.setattr(type(backend), "run_onnx", slow_lane)
    yielded, sent_at_start = [], []
    real_admit = batching.Batching.admit

    def admit(self, request, s, timer):
        if s == 1:  # the second sentence's start: how many of the first sentence's pieces went out before it
            sent_at_start.append(sum(c.sentence_index == 0 for c in yielded))
        return real_admit(self, request, s, timer)

    monkeypatch.setattr(batching.Batching, "admit", admit)
    for chunk in engine.synthesize_stream(text, **kw):
        yielded.append(chunk)  # noqa: PERF402 - (admit reads what went out so far)
    first_sentence = sum(c.sentence_index == 0 for c in alone)
    assert {c.sentence_index for c in alone} == {0, 1} and len(sent_at_start) == 1
    if send_first:
        assert sent_at_start == [first_sentence]
    elif first_sentence > 1:  # (its later pieces were in the slow lane when the next sentence started)
        assert sent_at_start[0] < first_sentence
    np.testing.assert_array_equal(np.concatenate([c.audio for c in yielded]), np.concatenate([c.audio for c in alone]))
