"""Parsing of text/control inputs and metadata handling (pure functions)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from dora_primespeech_mlx.dataflow.messages import (
    ECHO_CHARS,
    NAME_MAX_CHARS,
    PATH_MAX_CHARS,
    ControlCommand,
    InputError,
    decode_text_value,
    parse_control,
    parse_text,
)
from dora_primespeech_mlx.dataflow.metadata import as_int, sanitize_metadata
from dora_primespeech_mlx.text import has_speakable

# ---------------------------------------------------------------------------------------------------
# Arrow values


def test_decode_string_arrays():
    assert decode_text_value(pa.array(["你好，世界。"])) == "你好，世界。"
    assert decode_text_value(pa.array(["a"], type=pa.large_string())) == "a"
    assert decode_text_value(pa.array(["Hello", None, "world"])) == "Hello world"
    assert decode_text_value(pa.array([], type=pa.string())) == ""
    assert decode_text_value(pa.array([None, None], type=pa.null())) == ""
    assert decode_text_value(None) == ""


def test_decode_dictionary_encoded_strings():
    assert decode_text_value(pa.array(["Hello", "world", "Hello"]).dictionary_encode()) == "Hello world Hello"
    assert decode_text_value(pa.chunked_array([pa.array(["a"]).dictionary_encode()])) == "a"
    assert decode_text_value(pa.array([b"hi"]).dictionary_encode()) == "hi"


def test_decode_bytes_sent_with_send_output_bytes():
    raw = "VOICE:Maple|Hi there".encode("utf-8")  # noqa: UP012
    assert decode_text_value(pa.array(np.frombuffer(raw, dtype=np.uint8))) == "VOICE:Maple|Hi there"
    assert decode_text_value(pa.array([raw], type=pa.binary())) == "VOICE:Maple|Hi there"
    assert decode_text_value(raw) == "VOICE:Maple|Hi there"


def test_invalid_utf8_and_wrong_types_are_input_errors():
    with pytest.raises(InputError, match="UTF-8"):
        decode_text_value(pa.array(np.frombuffer(b"ok \xff\xfe bad", dtype=np.uint8)))
    with pytest.raises(InputError, match="UTF-8"):
        decode_text_value(pa.array([b"\xc3\x28"], type=pa.binary()))
    with pytest.raises(InputError, match="string array"):
        decode_text_value(pa.array([1.5, 2.5], type=pa.float32()))
    with pytest.raises(InputError, match="string array"):
        decode_text_value(pa.array([[1, 2]]))
    with pytest.raises(InputError):
        decode_text_value(42)


# ---------------------------------------------------------------------------------------------------
# text


def test_plain_text():
    r = parse_text("今天天气很好。")
    assert r.text == "今天天气很好。" and r.voice is None and r.overrides == {} and not r.warnings


@pytest.mark.parametrize("raw", ["42", "3.14", "true", "null", "[1]", '"quoted"', "{not json", "{}}"])
def test_json_that_is_not_an_object_or_malformed_is_plain_text(raw):
    r = parse_text(raw)
    assert r.text == raw and r.voice is None


def test_json_payload():
    r = parse_text(json.dumps({"prompt": "Hello.", "speed": 1.2, "voice": "Maple", "language": "EN",
                               "top_k": 3, "temperature": "0.7", "volume": 0.5}))
    assert r.text == "Hello."
    assert r.voice.kind == "name" and r.voice.name == "Maple"
    assert r.overrides == {"speed_factor": 1.2, "text_lang": "en", "top_k": 3, "temperature": 0.7}
    assert r.volume == 0.5
    assert parse_text('{"text": "via text key"}').text == "via text key"


def test_nested_json_inner_prompt_wins_outer_fills():
    inner = {"prompt": "inner text", "speed": 0.9}
    outer = {"prompt": json.dumps(inner), "speed": 1.5, "volume": 2.0}
    r = parse_text(json.dumps(outer))
    assert r.text == "inner text"
    assert r.overrides["speed_factor"] == 0.9 and r.volume == 2.0
    r = parse_text(json.dumps({"prompt": inner, "top_k": 2}))  # inner as an object, not a string
    assert r.text == "inner text" and r.overrides == {"speed_factor": 0.9, "top_k": 2}


def test_json_with_voice_prefix_inside():
    r = parse_text(json.dumps({"prompt": "VOICE:Luo Xiang|你好"}))
    assert r.voice.name == "Luo Xiang" and r.text == "你好"


@pytest.mark.parametrize(
    "payload, match",
    [
        ({"speed": 1.0}, "no 'prompt'"),
        ({"prompt": 42}, "must be a string"),
        ({"prompt": "x", "speed": "fast"}, "speed"),
        ({"prompt": "x", "top_k": 2.5}, "top_k"),
        ({"prompt": "x", "voice": 3}, "voice"),
        ({"prompt": "x", "speed": True}, "speed"),
        ({"prompt": "x", "volume": -1}, "volume"),
    ],
)
def test_bad_json_payloads(payload, match):
    with pytest.raises(InputError, match=match):
        parse_text(json.dumps(payload))


def test_pitch_is_ignored_with_a_warning():
    r = parse_text('{"prompt": "x", "pitch": 2}')
    assert r.text == "x" and any("pitch" in w for w in r.warnings)


def test_voice_prefix_named():
    r = parse_text("VOICE:Luo Xiang|你好|世界")
    assert r.voice.kind == "name" and r.voice.name == "Luo Xiang" and r.text == "你好|世界"


def test_voice_prefix_custom():
    r = parse_text("VOICE:CUSTOM|/abs/ref.wav|参考文本|zh|Text with | a pipe")
    v = r.voice
    assert (v.kind, v.reference, v.prompt_text, v.lang) == ("custom", "/abs/ref.wav", "参考文本", "zh")
    assert r.text == "Text with | a pipe"
    assert parse_text("VOICE:CUSTOM|/r.wav|p|fr|t").voice.lang == "auto"
    for lang in ("ja", "ko", "yue", "all_ja", "all_ko", "all_yue", "auto_yue"):
        assert parse_text(f"VOICE:CUSTOM|/r.wav|p|{lang.upper()}|t").voice.lang == lang


def test_voice_prefix_trained():
    r = parse_text("VOICE:TRAINED|/g.ckpt|/s.pth|/r.wav|prompt|en|Hello | world")
    v = r.voice
    assert (v.kind, v.gpt, v.sovits, v.reference, v.prompt_text, v.lang) == (
        "trained", "/g.ckpt", "/s.pth", "/r.wav", "prompt", "en")
    assert r.text == "Hello | world"


@pytest.mark.parametrize(
    "raw",
    ["VOICE:CUSTOM|/r.wav|prompt|zh", "VOICE:TRAINED|/g|/s|/r|p|en", "VOICE:Doubao", "VOICE:|text"],
)
def test_wrong_field_count_speaks_the_raw_string_with_a_warning(raw):
    r = parse_text(raw)
    assert r.text == raw and r.voice is None and r.warnings


def test_has_speakable():
    assert has_speakable("a") and has_speakable("你") and has_speakable("42")
    for text in ("", "   ", "。，！？", "...", "—— …", "\n\t"):
        assert not has_speakable(text)


# ---------------------------------------------------------------------------------------------------
# control


def test_control_commands():
    assert parse_control("reset") == ControlCommand("reset")
    assert parse_control(" STATS \n") == ControlCommand("stats")
    assert parse_control("list_voices") == ControlCommand("list_voices")
    assert parse_control("cleanup") == ControlCommand("cleanup")
    assert parse_control("change_voice:Luo Xiang") == ControlCommand("change_voice", "Luo Xiang")
    assert parse_control("voice:Maple") == ControlCommand("change_voice", "Maple")


@pytest.mark.parametrize("raw", ["", "restart", "change_voice:", "change_voice", "stats please"])
def test_unknown_control_is_an_error(raw):
    with pytest.raises(InputError):
        parse_control(raw)


# ---------------------------------------------------------------------------------------------------
# metadata


def test_metadata_pass_through_keeps_types():
    ts = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    md = {"question_id": "q7", "segment_index": "0", "session_status": "ongoing", "n": 3, "x": 0.5,
          "flag": True, "timestamp": ts, "ids": [1, 2], "names": ["a"], "empty": []}
    assert sanitize_metadata(md) == md
    out = sanitize_metadata(md)
    assert type(out["n"]) is int and type(out["x"]) is float and out["timestamp"] is ts


def test_metadata_values_dora_cannot_send_are_converted():
    out = sanitize_metadata({
        "i64": np.int64(7), "f32": np.float32(0.5), "b": np.bool_(True), "none": None,
        "d": {"a": 1}, "raw": b"ab", "mixed": [1, "a"], "nums": [1, 2.5], "tup": (1, 2),
        "npl": [np.int64(1), np.int64(2)], 5: "non-str key", "obj": object,
    })
    assert out["i64"] == 7 and type(out["i64"]) is int
    assert out["f32"] == 0.5 and type(out["f32"]) is float
    assert out["b"] is True
    assert out["none"] == "None" and json.loads(out["d"]) == {"a": 1}
    assert out["raw"] == "ab" and isinstance(out["mixed"], str)
    assert out["nums"] == [1.0, 2.5] and out["tup"] == [1, 2] and out["npl"] == [1, 2]
    assert out["5"] == "non-str key" and isinstance(out["obj"], str)
    assert sanitize_metadata(None) == {} and sanitize_metadata("x") == {}


def test_as_int_never_crashes():
    assert as_int("0") == 0 and as_int(" 12 ") == 12 and as_int(3) == 3 and as_int(2.0) == 2
    assert as_int("x") is None and as_int(None, -1) == -1 and as_int([1], -1) == -1
    assert as_int("nan", -1) == -1 and as_int(np.int64(5)) == 5


# ---------------------------------------------------------------------------------------------------
# error messages quote the input within bounds


@pytest.mark.parametrize("raw", ["VOICE:" + "n" * 5_000_000 + "|Hello",
                                 json.dumps({"prompt": "hi", "voice": "v" * 10**6}),
                                 json.dumps({"prompt": "hi", "speed": "s" * 10**6}),
                                 "VOICE:CUSTOM|" + "/p" * 10**5 + "|hi|en|Hello"])
def test_long_names_and_values_are_refused_with_a_short_quote(raw):
    with pytest.raises(InputError) as info:
        parse_text(raw)
    assert len(str(info.value)) < 2 * ECHO_CHARS + 200


def test_control_quotes_are_bounded():
    with pytest.raises(InputError) as info:
        parse_control("change_voice:" + "x" * 10_000)
    assert str(info.value).count("x") <= ECHO_CHARS and f"at most {NAME_MAX_CHARS}" in str(info.value)
    with pytest.raises(InputError) as info:
        parse_control("make " * 10_000)
    assert len(str(info.value)) < ECHO_CHARS + 200
    assert parse_control("change_voice:" + "x" * NAME_MAX_CHARS).arg == "x" * NAME_MAX_CHARS
    assert parse_text("VOICE:CUSTOM|" + "/" * PATH_MAX_CHARS + "|hi|en|Hello").voice.reference == "/" * PATH_MAX_CHARS
