"""A reference transcript in a message (``VOICE:CUSTOM``) is bounded (MAX_PROMPT_CHARS, docs/security.md): an
oversized one is answered with an error at once, before any work on the voice, and the node keeps serving."""

from __future__ import annotations

import time

import pyarrow as pa
from test_handler import completes, make_handler, model_dir, shared_engine, text  # noqa: F401 (fixtures)
from tiny_voice import reference_wav

from dora_primespeech_mlx.assets.catalog import MAX_PROMPT_CHARS


def test_an_oversized_prompt_in_a_message_is_refused_at_once(model_dir, shared_engine):  # noqa: F811
    handler, rec = make_handler(model_dir, shared_engine, PRIMESPEECH_REQUEST_PATHS=str(reference_wav().parent))
    prompt = "supercalifragilistic " * 2500
    t0 = time.monotonic()
    text(handler, f"VOICE:CUSTOM|{reference_wav()}|{prompt}|en|Hello world.", question_id="big")
    rec.wait(lambda r: len(completes(r)) == 1)
    took = time.monotonic() - t0
    handler.on_input("text", pa.array(["Hello there."]), {"question_id": "after"})
    rec.wait(lambda r: len(completes(r)) == 2)
    assert handler.finish(60)
    got = {m["question_id"]: (a.to_pylist(), m) for a, m in completes(rec)}
    values, md = got["big"]
    assert values == ["error"] and "MAX_PROMPT_CHARS" in md["error"] and str(MAX_PROMPT_CHARS) in md["error"]
    assert md["error_stage"] == "voice"
    assert took < 5, took  # the prompt's phones and BERT features were never computed
    assert got["after"][0] == ["completed"]
