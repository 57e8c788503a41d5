"""What each audio chunk speaks (``text``, ``text_start``) and what a cancelled utterance reports
(``spoken_text``, ``cut_*``, ``audio_sent_s``), through the handler with the REAL engine on the fixture voice:
Chinese, English and a mixed text, whole and streamed (``STREAMING=true``), as a plain text and as an LLM token
stream (``segment_id``/``seq``/``fin``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_handler import Recorder, completes, text
from tiny_voice import VOICE, make_model_dir

from dora_primespeech_mlx.dataflow.handler import MessageHandler
from dora_primespeech_mlx.dataflow.transport import DirectTransport
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.settings import Settings

CASES = {  # language -> an answer of several sentences, each with clauses
    "zh": "今天天气很好，我们去公园散步吧。公园里有很多花！明天见。",
    "en": "Hello there, how are you today? I am fine, thanks. See you soon!",
    "auto": "我们今天用 Python 写代码。It is a lot of fun, right? 好的，明天见！",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny voices plus one per language of :data:`CASES` (the same models, ``language`` set)."""
    root = make_model_dir(tmp_path_factory.mktemp("models"))
    base = yaml.safe_load((root / "voices" / VOICE / "voice.yaml").read_text(encoding="utf-8"))
    for lang in CASES:
        folder = root / "voices" / f"Tiny {lang}"
        folder.mkdir()
        data = {**base, "name": f"Tiny {lang}", "language": lang}
        (folder / "voice.yaml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def engine(model_dir):
    """The real engine; where the fixture set's BERT is narrower than the GPT's 1024 features (Chinese cannot be
    spoken with it), the voices' encoders get a random 1024-wide BERT with the fixture's tokenizer (as
    tests/engine/test_engine.py does): the spans do not depend on what the features are."""
    settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir),
                                  "GPTSVITS_WARMUP": "false", "TOP_K": "1"})
    engine, spec = engine_factory(settings)(lambda m: None)
    if json.loads((Path(spec.bert) / "config.json").read_text(encoding="utf-8"))["hidden_size"] != 1024:
        import mlx.core as mx

        from dora_primespeech_mlx.engine.encoders import EncoderBackends
        from dora_primespeech_mlx.models.bert.model import BertArgs, BertModel, BertTokenizer

        tokenizer = BertTokenizer.from_dir(spec.bert)
        mx.random.seed(0)
        bert = BertModel(BertArgs(vocab_size=max(200, len(tokenizer.vocab) if hasattr(tokenizer, "vocab") else 200),
                                  hidden_size=1024, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=512))
        mx.eval(bert.parameters())  # (made here, used on the node's worker thread)
        encoders = EncoderBackends(mode="mlx", mlx_bert=lambda: (bert, tokenizer),
                                   mlx_hubert=lambda: engine.store.model("hubert", spec.hubert, spec.name))
        models = engine.store.models

        def with_wide_bert(voice):
            m = models(voice)
            m.encoders = encoders
            return m

        engine.store.models = with_wide_bert
    return engine


def handler_for(model_dir, engine, lang, **env):
    base = {"VOICE_NAME": f"Tiny {lang}", "PRIMESPEECH_MODEL_DIR": str(model_dir), "TOP_K": "1"}
    rec = Recorder()
    handler = MessageHandler(Settings.from_env({**base, **env}),
                             lambda progress: (engine, engine.load_voice(f"Tiny {lang}")), DirectTransport(rec))
    handler.start()
    assert handler.ready.wait(60) and handler.startup_error is None
    return handler, rec


def fragments_of(answer: str, seed: int) -> list[str]:
    rng, out, i = np.random.default_rng(seed), [], 0
    while i < len(answer):
        k = int(rng.integers(2, 6))
        out.append(answer[i:i + k])
        i += k
    return out


def send_stream(handler, answer: str, session: str, segment: int, seed: int = 0, **extra) -> None:
    pieces = fragments_of(answer, seed)
    for n, piece in enumerate(pieces):
        md = {"session_id": session, "segment_id": segment, "seq": n, **(extra if n == 0 else {})}
        if n == len(pieces) - 1:
            md["fin"] = True
        text(handler, piece, **md)


def squeeze(s: str) -> str:
    return re.sub(r"\s+", "", s)


def check_tiles(chunks: list[dict], spoken: str | None = None) -> str:
    """The chunks' spans start at 0, each where the one before it ended, and each chunk's text is its span's
    length; returns the texts joined (with ``spoken``: they are exactly it)."""
    assert chunks, "no audio"
    at = 0
    for md in chunks:
        assert isinstance(md["text"], str) and type(md["text_start"]) is int and "text_end" not in md
        assert md["text_start"] == at, (md["text_start"], at, [m["text"] for m in chunks])
        at = md["text_start"] + len(md["text"])
    joined = "".join(md["text"] for md in chunks)
    if spoken is not None:
        assert joined == spoken and at == len(spoken)
    return joined


@pytest.mark.parametrize("streaming", ["false", "true"])
@pytest.mark.parametrize("lang", sorted(CASES))
def test_audio_chunks_carry_the_text_they_speak(model_dir, engine, lang, streaming):
    """A plain text's chunks tile its text exactly; an utterance's chunks (fragments of 2-5 characters) tile its
    spoken text, whose words are the answer's; a sentence's first chunk carries its text, later ones an empty
    span at its end; whole, each audio message is one sentence of the utterance."""
    answer = CASES[lang]
    handler, rec = handler_for(model_dir, engine, lang, STREAMING=streaming)
    try:
        text(handler, json.dumps({"prompt": answer, "language": lang}), question_id="plain")
        send_stream(handler, answer, "chat", 1)
        rec.wait(lambda r: len(completes(r)) == 2)
        assert [v.to_pylist() for v, _ in completes(rec)] == [["completed"], ["completed"]]
        audio = [m for _, m in rec.of("audio")]
        plain = [m for m in audio if m.get("question_id") == "plain"]
        check_tiles(plain, answer)
        utterance = [m for m in audio if m.get("segment_id") == 1]
        assert squeeze(check_tiles(utterance)) == squeeze(answer)
        for chunks in (plain, utterance):
            for md in chunks:  # a chunk that starts a sentence carries it; the others an empty span
                if md["chunk_index"] == 0:
                    assert md["text"].strip()
        if streaming == "false":
            assert len(plain) == 1 and plain[0]["text"] == answer
            sentences = [md["text"].strip() for md in utterance]
            assert squeeze("".join(sentences)) == squeeze(answer) and len(sentences) >= 3
            assert all(s[-1] in "。！？.!?" for s in sentences), sentences
        else:
            assert len(plain) > 1 and sum(bool(md["text"]) for md in plain) >= 3  # clause by clause (cut5)
    finally:
        handler.stop()


def test_a_barge_in_reports_what_of_the_utterance_went_out(model_dir, engine):
    """STREAMING=true: a flush while an utterance of many sentences streams answers it with ``spoken_text`` (a
    prefix of its text ending with the last sentence whose audio went out whole: the texts of its chunks before
    the cut sentence's), the cut sentence with the span its sent audio covered, and the seconds of audio sent."""
    lang = "en"
    answer = " ".join(f"Sentence number {n} is here, and it goes on for a while." for n in range(1, 9))
    handler, rec = handler_for(model_dir, engine, lang, STREAMING="true")
    try:
        send_stream(handler, answer, "chat", 1)
        first = answer.index(" Sentence number 2")
        rec.wait(lambda r: any(m.get("segment_id") == 1 and m["text_start"] > first and not m["text"]
                               for _, m in r.of("audio")))  # within the second sentence or later
        send_stream(handler, "Sorry, go on.", "chat", 2, flush=True)
        rec.wait(lambda r: len(completes(r)) == 2)
        (v1, md), (v2, _) = completes(rec)
        assert v1.to_pylist() == ["error"] and md["error_stage"] == "flush" and v2.to_pylist() == ["completed"]
        sent = [m for _, m in rec.of("audio") if m.get("segment_id") == 1]
        joined = check_tiles(sent)
        assert md["audio_sent_s"] == pytest.approx(sum(m["duration"] for m in sent), abs=2e-3)
        spoken = md["spoken_text"]
        assert squeeze(answer).startswith(squeeze(spoken)) and md["spoken_end"] == len(spoken)
        assert joined.startswith(spoken) and (not spoken or spoken.rstrip()[-1] == ".")
        assert len(squeeze(spoken)) < len(squeeze(answer)) and spoken.startswith(answer[:first])
        if "cut_text" in md:  # a sentence was cut: its sent span is what the chunks after spoken_text carry
            assert md["cut_start"] == md["spoken_end"] and joined[md["cut_start"]:] == md["cut_sent_text"]
            assert md["cut_text"].startswith(md["cut_sent_text"]) and md["cut_sent_end"] <= md["cut_end"]
            assert md["cut_text"].strip().endswith(".") and squeeze(md["cut_text"]) in squeeze(answer)
        else:  # cut between two sentences: everything sent was whole
            assert joined == spoken
        (status,) = [s for s in rec.statuses() if s["status"] == "cancelled"]
        assert status["spoken_text"] == spoken and status["audio_sent_s"] == md["audio_sent_s"]
    finally:
        handler.stop()
