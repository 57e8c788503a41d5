"""The node's message handler with a recording ``send`` and the REAL engine on the fixture voice."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from tiny_voice import VOICE, VOICE_2, e2e_case, make_model_dir, reference_wav

from dora_primespeech_mlx.dataflow.handler import CANCELLED, MessageHandler
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.settings import Settings

TEXT = "Hello world, this is a small test."
LONG = "One small test. Two small tests. Three small tests. Four small tests. Five small tests."


class Recorder:
    """A fake ``send_output``: records (output, array, metadata) from any thread."""

    def __init__(self):
        self.sent: list[tuple[str, pa.Array, dict]] = []
        self.cv = threading.Condition()

    def __call__(self, output, array, metadata):
        assert isinstance(array, pa.Array)
        assert all(isinstance(k, str) for k in metadata)
        with self.cv:
            self.sent.append((output, array, dict(metadata)))
            self.cv.notify_all()

    def of(self, output):
        with self.cv:
            return [(a, m) for o, a, m in self.sent if o == output]

    def statuses(self):
        return [json.loads(a[0].as_py()) for a, _ in self.of("status")]

    def wait(self, pred, timeout=300.0):
        with self.cv:
            assert self.cv.wait_for(lambda: pred(self), timeout), "timed out"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def shared_engine(model_dir):
    """One real engine for the module (loading costs seconds); each test gets its own handler."""
    settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir),
                                  "GPTSVITS_WARMUP": "false", "TOP_K": "1"})
    messages = []
    engine, spec = engine_factory(settings)(messages.append)
    assert any("loaded" in m for m in messages)
    return engine, spec


def make_handler(model_dir, shared_engine, **env):
    base = {"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "TOP_K": "1", "LOG_LEVEL": "DEBUG"}
    settings = Settings.from_env({**base, **env})
    rec = Recorder()
    handler = MessageHandler(settings, lambda progress: shared_engine, DirectTransport(rec))
    handler.start()
    assert handler.ready.wait(60) and handler.startup_error is None
    return handler, rec


def text(handler, value, **md):
    handler.on_input("text", pa.array([value]) if isinstance(value, str) else value, md)


def completes(rec):
    return rec.of("segment_complete")


def test_batch_text_gets_audio_and_one_segment_complete(model_dir, shared_engine):
    handler, rec = make_handler(model_dir, shared_engine)
    md = {"question_id": "q1", "segment_index": "0", "session_status": "started", "session_id": "s",
          "custom": 7, "ratio": 0.5, "flag": True, "np_int": np.int64(3), "nothing": None}
    text(handler, TEXT, **md)
    rec.wait(lambda r: len(completes(r)) == 1)
    assert handler.finish(60)
    audio = rec.of("audio")
    assert len(audio) == 1
    arr, amd = audio[0]
    assert pa.types.is_list(arr.type) and len(arr) == 1  # pa.array([float32 samples])
    samples = np.asarray(arr[0].as_py(), dtype=np.float32)
    assert samples.size > 0 and np.isfinite(samples).all() and np.abs(samples).max() <= 1.0
    assert amd["sample_rate"] == 32000 and type(amd["sample_rate"]) is int
    assert amd["duration"] == pytest.approx(samples.size / 32000) and type(amd["duration"]) is float
    assert (amd["chunk_index"], amd["fragment_num"], amd["is_final"], amd["is_streaming"]) == (0, 1, True, False)
    assert amd["voice"] == VOICE and amd["language"] == e2e_case()["inputs"]["text_lang"]  # the voice's language
    for key in ("question_id", "session_status", "session_id", "custom", "ratio", "flag"):
        assert amd[key] == md[key] and type(amd[key]) is type(md[key]), key
    assert amd["segment_index"] == 0 and type(amd["segment_index"]) is int  # "0" arrives, an int leaves
    assert amd["np_int"] == 3 and type(amd["np_int"]) is int and amd["nothing"] == "None"
    (value, cmd), = completes(rec)
    assert value.to_pylist() == ["completed"]
    assert cmd["question_id"] == "q1" and cmd["segment_index"] == 0 and cmd["session_status"] == "started"
    assert [s["status"] for s in rec.statuses()] == ["synthesizing", "done"]
    logs = [json.loads(a[0].as_py()) for a, _ in rec.of("log")]
    assert all(set(entry) == {"node", "level", "message", "timestamp"} for entry in logs)


def test_flat_audio_format_and_volume(model_dir, shared_engine):
    handler, rec = make_handler(model_dir, shared_engine, AUDIO_FORMAT="flat")
    text(handler, json.dumps({"prompt": "Hi there.", "volume": 0.0}), question_id="v")
    rec.wait(lambda r: len(completes(r)) == 1)
    assert handler.finish(60)
    (arr, _), = rec.of("audio")
    assert arr.type == pa.float32() and len(arr) > 0
    assert np.all(arr.to_numpy() == 0.0)  # volume 0 silences it
    assert completes(rec)[0][0].to_pylist() == ["completed"]


def test_bad_inputs_are_answered_and_the_node_keeps_serving(model_dir, shared_engine):
    handler, rec = make_handler(model_dir, shared_engine, MAX_TEXT_CHARS="1000",
                                PRIMESPEECH_REQUEST_PATHS=str(reference_wav().parent))
    cases = [
        ("empty", "", "skipped"),
        ("punct", "。，！？...", "skipped"),
        ("flush", "", "skipped"),  # the segmenter's flush (session_status ended)
        ("long", "word " * 20000, "error"),
        ("utf8", pa.array(np.frombuffer(b"bad \xff\xfe", dtype=np.uint8)), "error"),
        ("float", pa.array([0.5, 1.5], type=pa.float32()), "error"),
        ("voice", "VOICE:Nobody At All|Hello", "error"),
        ("json", '{"speed": 1.2}', "error"),
        ("lang", json.dumps({"prompt": "Hello", "language": "fr"}), "error"),
        ("ja", f"VOICE:CUSTOM|{reference_wav()}|おはようございます|ja|こんにちは、元気ですか。", "completed"),
        ("ko", json.dumps({"prompt": "안녕하세요, 반갑습니다.", "language": "ko"}), "completed"),
        ("yue", json.dumps({"prompt": "你好，我係你嘅助手。", "language": "all_yue"}), "completed"),
    ]
    for i, (name, value, _) in enumerate(cases):
        status = "ended" if name == "flush" else "ongoing"
        text(handler, value, question_id=name, segment_index=i, session_status=status)
    handler.on_input("control", pa.array(["restart everything"]), {"control_id": 1})
    handler.on_input("text", pa.array([TEXT]), {"question_id": "after", "segment_index": "x"})
    rec.wait(lambda r: len(completes(r)) == len(cases) + 1)
    assert handler.finish(60)
    got = {m["question_id"]: (a.to_pylist(), m) for a, m in completes(rec)}
    assert len(completes(rec)) == len(cases) + 1  # exactly one each
    for name, _, outcome in cases:
        values, md = got[name]
        assert values == [outcome], name
        if outcome == "error":
            assert md["session_status"] == "error" and md["error"] and md["error_stage"], name
    assert got["flush"][1]["session_status"] == "ended"
    assert "too long" in got["long"][1]["error"]
    assert "UTF-8" in got["utf8"][1]["error"]
    assert "unknown voice" in got["voice"][1]["error"] and got["voice"][1]["error_stage"] == "voice"
    assert "'fr'" in got["lang"][1]["error"].lower() and got["lang"][1]["error_stage"] == "text"
    assert got["after"][0] == ["completed"]  # still serving
    errors = [s for s in rec.statuses() if s["status"] == "error"]
    assert any("unknown control command" in s["error"] for s in errors)
    # answers come in input order
    assert [m["question_id"] for _, m in completes(rec)] == [c[0] for c in cases] + ["after"]


def test_every_text_gets_a_reason_a_person_can_read(model_dir, shared_engine):
    """An English voice and a Chinese text: ``skipped`` with the reason (and what to do) on segment_complete, on the
    ``skipped`` status that follows ``synthesizing`` and in one WARNING on ``log``; an empty text and a failing
    one carry their reason too."""
    engine, spec = shared_engine
    english = (engine, dataclasses.replace(spec, language="en"))
    base = {"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "TOP_K": "1", "LOG_LEVEL": "INFO"}
    rec = Recorder()
    handler = MessageHandler(Settings.from_env(base), lambda progress: english, DirectTransport(rec))
    handler.start()
    assert handler.ready.wait(60) and handler.startup_error is None
    text(handler, "你好，今天天气很好。", question_id="zh")
    text(handler, "", question_id="empty")
    text(handler, json.dumps({"prompt": "Hello", "language": "fr"}), question_id="bad")
    text(handler, json.dumps({"prompt": "你好，今天天气很好。", "language": "en"}), question_id="zh-as-en")
    rec.wait(lambda r: len(completes(r)) == 4)
    assert handler.finish(60)
    got = {m["question_id"]: (a.to_pylist(), m) for a, m in completes(rec)}
    assert got["zh"][0] == ["skipped"]
    reason = got["zh"][1]["reason"]
    assert "nothing speakable as 'en'" in reason and "the voice's language" in reason and "`language`" in reason
    assert "auto" in reason
    assert "the text's language" in got["zh-as-en"][1]["reason"]
    assert got["empty"][0] == ["skipped"] and "nothing to speak" in got["empty"][1]["reason"]
    assert got["bad"][0] == ["error"] and got["bad"][1]["reason"] == got["bad"][1]["error"]
    by_question: dict[str, list[dict]] = {}
    for (a, m) in rec.of("status"):
        by_question.setdefault(m.get("question_id"), []).append(json.loads(a[0].as_py()))
    zh = by_question["zh"]
    assert [s["status"] for s in zh] == ["synthesizing", "skipped"]
    assert zh[1]["reason"] == reason and zh[1]["message"] == reason and zh[1]["level"] == "WARNING"
    assert [s["status"] for s in by_question["empty"]] == ["skipped"]
    assert [s["status"] for s in by_question["bad"]][-1] == "error" and by_question["bad"][-1]["reason"]
    for qid, statuses in by_question.items():  # every synthesizing is followed by done, skipped or error
        kinds = [s["status"] for s in statuses]
        for i, kind in enumerate(kinds):
            if kind == "synthesizing":
                assert kinds[i + 1:i + 2] and kinds[i + 1] in ("done", "skipped", "error"), (qid, kinds)
    logs = [json.loads(a[0].as_py()) for a, _ in rec.of("log")]
    warnings = [e for e in logs if e["level"] == "WARNING" and reason in e["message"]]
    assert len(warnings) == 1, logs


def test_runtime_parameters_take_their_place_among_the_texts(model_dir, shared_engine, monkeypatch):
    """``dora param set`` (PARAM_UPDATE events): voice as change_voice, speed/language as the texts' defaults,
    each in send order and answered on ``status``; a bad one is answered with an error and changes nothing."""
    engine = shared_engine[0]
    asked = []
    stream = engine.synthesize_stream

    def recording(text, **kw):
        asked.append(kw.get("speed_factor"))
        return stream(text, **kw)

    monkeypatch.setattr(engine, "synthesize_stream", recording)
    handler, rec = make_handler(model_dir, shared_engine)
    text(handler, "Hi there.", question_id="before")
    handler.on_parameter("voice", VOICE_2)
    handler.on_parameter("speed", 9)  # out of range
    handler.on_parameter("volume", 1)  # unknown
    handler.on_parameter("speed", 1.5)
    handler.on_parameter("streaming", True)
    text(handler, "Hi there.", question_id="after")
    rec.wait(lambda r: len(completes(r)) == 2)
    handler.on_parameter("speed", None)  # deleted: the voice's own again
    rec.wait(lambda r: sum(s["status"] == "parameter_set" for s in r.statuses()) == 3)
    assert handler.finish(60)
    voice_of = {m["question_id"]: m["voice"] for _, m in rec.of("audio")}
    assert voice_of == {"before": VOICE, "after": VOICE_2}
    streamed = {m["question_id"]: m["is_streaming"] for _, m in rec.of("audio")}
    assert streamed == {"before": False, "after": True}  # streaming: true from the text after it
    assert asked == [1.5]  # the streamed text (after the parameter) asked for speed 1.5
    answers = [(json.loads(a[0].as_py()), m) for a, m in rec.of("status")]
    changed = [(b, m) for b, m in answers if b["status"] == "voice_changed"]
    assert len(changed) == 1 and changed[0][0]["voice"] == VOICE_2 and changed[0][1]["parameter"] == "voice"
    errors = {m["parameter"]: b for b, m in answers if b["status"] == "error" and "parameter" in m}
    assert set(errors) == {"speed", "volume"} and "0.25..4" in errors["speed"]["reason"]
    assert "known: voice, speed, language" in errors["volume"]["reason"]
    sets = [b for b, _ in answers if b["status"] == "parameter_set"]
    assert [(b["parameter"], b["value"]) for b in sets] == [("speed", 1.5), ("streaming", True), ("speed", None)]
    assert sets[1]["parameters"]["speed"] == 1.5 and "speed" not in sets[2]["parameters"]
    assert handler.params.overrides == {}


def test_control_commands(model_dir, shared_engine):
    handler, rec = make_handler(model_dir, shared_engine)
    for i, cmd in enumerate(["list_voices", "stats", "change_voice:No Such Voice", f"change_voice:{VOICE_2}",
                             "cleanup"]):
        handler.on_input("control", pa.array([cmd]), {"control_id": i})
    rec.wait(lambda r: len(r.of("status")) >= 5)
    text(handler, "Hi there.", question_id="after-change")
    rec.wait(lambda r: len(completes(r)) == 1)
    assert handler.finish(60)
    answers = {m["control_id"]: json.loads(a[0].as_py()) for a, m in rec.of("status") if "control_id" in m}
    voices = answers[0]
    assert voices["status"] == "voices" and voices["current"] == VOICE
    listed = {v["name"]: v for v in voices["voices"]}
    assert listed[VOICE]["installed"] is True and listed[VOICE_2]["installed"] is True
    assert "Doubao" in listed  # presets are listed with their installed flag
    assert answers[1]["status"] == "stats" and "requests" in answers[1]["stats"]
    assert answers[2]["status"] == "error" and "No Such Voice" in answers[2]["error"]
    assert answers[2]["voice"] == VOICE  # kept the old voice
    assert answers[3]["status"] == "voice_changed" and answers[3]["voice"] == VOICE_2
    assert answers[3]["language"] == e2e_case()["inputs"]["text_lang"]  # the voice's language (its YAML)
    assert answers[4]["status"] == "cleanup"
    (_, amd), = rec.of("audio")
    assert amd["voice"] == VOICE_2


def test_reset_cancels_a_long_streaming_synthesis_and_the_queue(model_dir, shared_engine):
    handler, rec = make_handler(model_dir, shared_engine, STREAMING="true")
    text(handler, LONG, question_id="long", segment_index=0)
    text(handler, TEXT, question_id="queued1", segment_index=1)
    text(handler, TEXT, question_id="queued2", segment_index=2)
    rec.wait(lambda r: len(r.of("audio")) >= 1)
    t0 = time.monotonic()
    handler.on_input("control", pa.array(["reset"]), {"control_id": "r"})
    rec.wait(lambda r: len(completes(r)) == 3)
    cancel_s = time.monotonic() - t0
    text(handler, "Hi there.", question_id="after", segment_index=3)
    rec.wait(lambda r: len(completes(r)) == 4)
    assert handler.finish(60)
    got = [(a.to_pylist(), m) for a, m in completes(rec)]
    assert [m["question_id"] for _, m in got].count("long") == 1
    for values, md in got[:3]:
        assert values == ["error"] and md["error"] == CANCELLED and md["error_stage"] == "reset"
    assert got[3][0] == ["completed"]
    reset = next(s for s in rec.statuses() if s["status"] == "reset")
    assert reset["cancelled"] == 3
    long_chunks = [m for _, m in rec.of("audio") if m["question_id"] == "long"]
    assert long_chunks and not any(m["is_final"] for m in long_chunks)  # cut short
    after = [m for _, m in rec.of("audio") if m["question_id"] == "after"]
    assert [m["chunk_index"] for m in after] == list(range(len(after)))
    assert [m["fragment_num"] for m in after] == [i + 1 for i in range(len(after))]
    assert after[-1]["is_final"] and all(m["is_streaming"] for m in after)
    assert cancel_s < 60, f"reset took {cancel_s:.1f} s"


def test_trained_voice_with_a_hostile_checkpoint_is_an_error_and_the_next_load_works(model_dir, shared_engine):
    """``VOICE:TRAINED`` naming a GPT checkpoint with a negative storage offset or NaN weights is answered with an
    error segment_complete, nothing of it is cached, and the next text with a clean checkpoint completes."""
    import shutil

    from tiny_voice import checkpoint, e2e_case

    from tests.convert.test_converted_cache import NAN16, rewrite

    folder = model_dir / "trained"
    folder.mkdir(exist_ok=True)
    ref, sovits = folder / "ref.wav", folder / "sovits.pth"  # inside the model folder (PRIMESPEECH_REQUEST_PATHS)
    shutil.copy(reference_wav(), ref)
    shutil.copy(checkpoint("sovits"), sovits)
    gpts = {"offset": rewrite(checkpoint("gpt"), folder / "offset.ckpt", negative_offset=True),
            "nan": rewrite(checkpoint("gpt"), folder / "nan.ckpt", storage=NAN16),
            "good": folder / "good.ckpt"}
    shutil.copy(checkpoint("gpt"), gpts["good"])
    prompt = e2e_case()["inputs"]["prompt_text"]
    handler, rec = make_handler(model_dir, shared_engine)
    for name, gpt in gpts.items():
        text(handler, f"VOICE:TRAINED|{gpt}|{sovits}|{ref}|{prompt}|en|Hello world.", question_id=name)
    rec.wait(lambda r: len(completes(r)) == len(gpts))
    assert handler.finish(60)
    got = {m["question_id"]: (a.to_pylist(), m) for a, m in completes(rec)}
    for bad in ("offset", "nan"):  # refused by the reader; the answer names the error class, not the file's bytes
        assert got[bad][0] == ["error"] and "CheckpointError" in got[bad][1]["error"], got[bad][1]
    assert got["good"][0] == ["completed"]
    cached = [p.name for p in (model_dir / "mlx").iterdir()]
    assert any(n.startswith("gpt-good-") for n in cached)
    assert not any(n.startswith(("gpt-offset-", "gpt-nan-")) for n in cached), cached


def test_queued_texts_join_the_running_decode_and_keep_their_tokens(model_dir, shared_engine, monkeypatch):
    """Streaming, a burst of texts: those queued behind the one being spoken join its GPT decode (continuous
    batching); each is still answered in order, and each text's tokens are those of its decode alone."""
    from dora_primespeech_mlx.engine import batching, pipeline
    from dora_primespeech_mlx.models.gpt import generate as t2s_generate

    engine, spec = shared_engine
    if pipeline.batch_width(engine.store.models(spec), 4) < 2:
        pytest.skip("the GPT decodes without the float16 kernels here: nothing to batch")
    monkeypatch.setattr(batching, "ADMIT_QUEUED_S", 0.0)  # join as soon as audio is out (the fixture GPT is fast)
    monkeypatch.setattr(batching, "UPCOMING_EVERY_S", 0.0)
    texts = ["Hello world, this is the first message.", "And this is the second one.", "A third one ends it."]
    tokens: dict[str, list[int]] = {}  # phones' digest -> tokens, for every generation made
    joined: list = []
    real_start, real_admit = t2s_generate.start, batching.Batching.admit

    def start(model, phones, bert, prompt, params, early_stop_num, **kw):
        gen = real_start(model, phones, bert, prompt, params, early_stop_num, **kw)
        out = tokens.setdefault(phones.tobytes(), [])
        choose = gen.choose

        def spied():
            step = choose()
            if step.keep:
                out.append(step.token)
            return step

        gen.choose = spied
        return gen

    def admit(self, request, s, timer):
        joined.append((id(request), s))
        return real_admit(self, request, s, timer)

    monkeypatch.setattr(pipeline, "start", start)  # where the engine starts a batch row
    monkeypatch.setattr(batching.Batching, "admit", admit)
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, batch=4))
    handler, rec = make_handler(model_dir, shared_engine, STREAMING="true", SEED="31")
    for i, t in enumerate(texts):
        text(handler, t, question_id=f"q{i}")
    rec.wait(lambda r: len(completes(r)) == 3)
    assert handler.finish(60)
    assert [m["question_id"] for _, m in completes(rec)] == ["q0", "q1", "q2"]
    assert all(v.to_pylist() == ["completed"] for v, _ in completes(rec))
    order = [m["question_id"] for _, m in rec.of("audio")]
    assert order == sorted(order), "audio of a later text came before an earlier text's"
    batched = dict(tokens)
    assert len({r for r, _ in joined}) >= 2 and engine.batching.batch.row_steps > engine.batching.batch.steps

    tokens.clear()
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, batch=1))
    handler, rec = make_handler(model_dir, shared_engine, STREAMING="true", SEED="31")
    for i, t in enumerate(texts):
        text(handler, t, question_id=f"q{i}")
        rec.wait(lambda r, n=i + 1: len(completes(r)) == n)  # one at a time: nothing queued behind it
    assert handler.finish(60)
    assert batched == tokens


def test_a_text_s_stream_plans_with_the_audio_the_node_sent_before_it_in_hand(model_dir, shared_engine,
                                                                             monkeypatch):
    """The node tells the engine when the audio it sent so far will have played (a player that starts each chunk on
    arrival or after the one before it): a text spoken right after another starts with that audio in hand; after a
    reset (a player may drop what it holds) the next text plans without it."""
    engine, _ = shared_engine
    asked, real = [], engine.synthesize_stream

    def recording(text, **kw):
        asked.append((time.perf_counter(), kw["listener"].playing_until()))  # (the board's value at the call)
        return real(text, **kw)

    monkeypatch.setattr(engine, "synthesize_stream", recording)
    handler, rec = make_handler(model_dir, shared_engine, STREAMING="true")
    arrivals = []
    text(handler, TEXT, question_id="a")
    rec.wait(lambda r: len(completes(r)) == 1)
    for _, amd in rec.of("audio"):
        arrivals.append(float(amd["duration"]))
    text(handler, TEXT, question_id="b")
    rec.wait(lambda r: len(completes(r)) == 2)
    handler.on_input("control", pa.array(["reset"]), {})
    rec.wait(lambda r: any(s["status"] == "reset" for s in r.statuses()))
    text(handler, TEXT, question_id="c")
    rec.wait(lambda r: len(completes(r)) == 3)
    assert handler.finish(60)
    (t_a, until_a), (t_b, until_b), (_, until_c) = asked
    assert until_a is None  # nothing sent before the first text
    # the first text's audio, played from its first chunk's arrival at the earliest: still playing when the second
    # text was asked for, unless the machine took longer than that audio to answer it
    assert until_b is not None and until_b >= t_a + sum(arrivals)
    assert until_c is None


def test_an_engine_stream_counts_the_caller_s_audio_in_hand_only_while_it_plays(shared_engine, monkeypatch):
    """``synthesize_stream(playing_until=...)``: the pacer's first deadline is that time while it is ahead (the
    listener still plays the caller's earlier audio), none where it passed or is not given; anything but a finite
    number or None is a ValueError when the stream is asked for."""
    from dora_primespeech_mlx.engine import pacing

    engine, _ = shared_engine
    list(engine.synthesize_stream(TEXT, seed=1))  # the engine's speeds, measured (the pacer plans with them)
    deadlines, real = [], pacing.Pacer.cut

    def cut(self, new_tokens, now, deadline):
        deadlines.append(deadline)
        return real(self, new_tokens, now, deadline)

    monkeypatch.setattr(pacing.Pacer, "cut", cut)
    for playing_until in (time.perf_counter() + 60.0, time.perf_counter() - 1.0, None):
        deadlines.clear()
        assert list(engine.synthesize_stream(TEXT, seed=1, playing_until=playing_until))
        if playing_until is not None and playing_until > time.perf_counter():
            assert deadlines[0] == playing_until
        else:
            assert deadlines[0] is None
    deadlines.clear()
    for hostile in (float("nan"), float("inf"), -float("inf"), "soon", True, [1.0]):  # refused before any work
        with pytest.raises(ValueError, match="playing_until"):
            engine.synthesize_stream(TEXT, seed=1, playing_until=hostile)
    assert deadlines == []


def test_a_streamed_utterance_speaks_each_sentence_as_that_sentence_given_whole(model_dir, shared_engine):
    """An LLM token stream (fragments of 2-5 characters with segment_id/seq/fin) is spoken sentence by sentence,
    and each sentence's samples equal those of the same sentence sent as a text of its own (same seed)."""
    handler, rec = make_handler(model_dir, shared_engine)
    answer = "<think>Greet them. Keep it short.</think>Hello there. **Nice** to meet you!\n1. One small test."
    sentences = ["Hello there.", "Nice to meet you!", "1. One small test."]
    rng = np.random.default_rng(0)
    fragments, i = [], 0
    while i < len(answer):
        k = int(rng.integers(2, 6))
        fragments.append(answer[i:i + k])
        i += k
    for n, fragment in enumerate(fragments):
        md = {"session_id": "chat", "segment_id": 7, "seq": n}
        if n == len(fragments) - 1:
            md["fin"] = True
        text(handler, fragment, **md)
    rec.wait(lambda r: len(completes(r)) == 1)
    for n, sentence in enumerate(sentences):
        text(handler, sentence, question_id=f"whole{n}")
    rec.wait(lambda r: len(completes(r)) == 1 + len(sentences))
    assert handler.finish(60)
    (value, cmd), *whole_answers = completes(rec)
    assert value.to_pylist() == ["completed"] and (cmd["session_id"], cmd["segment_id"]) == ("chat", 7)
    assert [v.to_pylist() for v, _ in whole_answers] == [["completed"]] * len(sentences)
    audio = rec.of("audio")
    streamed = [(a, m) for a, m in audio if m.get("segment_id") == 7]
    assert [m["seq"] for _, m in streamed] == list(range(len(sentences)))
    assert [m["fin"] for _, m in streamed] == [False] * (len(sentences) - 1) + [True]
    for n in range(len(sentences)):
        (whole, _), = [(a, m) for a, m in audio if m.get("question_id") == f"whole{n}"]
        got = np.asarray(streamed[n][0][0].as_py(), dtype=np.float32)
        want = np.asarray(whole[0].as_py(), dtype=np.float32)
        assert got.size > 0 and np.array_equal(got, want), sentences[n]


def test_a_barge_in_cuts_a_streamed_sentence_short(model_dir, shared_engine):
    """STREAMING=true, real engine: a ``flush: true`` that starts a new segment while a long sentence of the old one
    streams stops it at the engine's next checkpoint (the worker is free again long before that sentence would
    have ended), no chunk of the old segment follows, and the new segment's first audio carries ``flush``."""
    handler, rec = make_handler(model_dir, shared_engine, STREAMING="true")
    long = " ".join(f"Sentence part number {n}, a small test" for n in range(1, 9)) + "."

    def speak(segment, body, **extra):
        text(handler, body, session_id="chat", segment_id=segment, seq=0, fin=True, **extra)

    t0 = time.perf_counter()
    speak(1, long)  # once whole, to know how long it takes
    rec.wait(lambda r: len(completes(r)) == 1)
    whole_s = time.perf_counter() - t0
    speak(2, long)
    rec.wait(lambda r: any(m.get("segment_id") == 2 for _, m in r.of("audio")))
    old = handler.jobs.current
    t_flush = time.perf_counter()
    speak(3, "Hi there.", flush=True)
    while handler.jobs.current is old:
        time.sleep(0.001)
    freed_s = time.perf_counter() - t_flush
    rec.wait(lambda r: len(completes(r)) == 3)
    assert handler.finish(60)
    print(f"barge-in: the worker left the old sentence {freed_s * 1000:.0f} ms after the flush "
          f"(the sentence takes {whole_s:.2f} s whole)")
    assert freed_s < 0.25 * whole_s
    sent = [m for o, _, m in rec.sent if o == "audio"]
    first_new = next(i for i, m in enumerate(sent) if m.get("segment_id") == 3)
    assert sent[first_new]["flush"] is True and not [m for m in sent[first_new:] if m.get("segment_id") == 2]
    assert sum(m.get("flush") is True for m in sent) == 1
    (seg2,) = [m for _, m in completes(rec) if m.get("segment_id") == 2]
    assert seg2["error_stage"] == "flush"
    new = [m for m in sent if m.get("segment_id") == 3]
    assert [m["seq"] for m in new] == list(range(len(new))) and new[-1]["fin"] is True
