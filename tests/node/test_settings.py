"""Settings read from the environment: names, aliases, precedence, parsing of Dora's string values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dora_primespeech_mlx.errors import ConfigError
from dora_primespeech_mlx.settings import VARS, Settings, describe


def test_defaults_with_empty_environment():
    s = Settings.from_env({})
    assert s == Settings()
    assert s.voice == "Doubao"
    assert s.streaming is False
    assert s.audio_format == "list"
    assert s.model_dir == Path("~/.dora/models/primespeech").expanduser()


def test_every_field_has_exactly_one_setting_and_a_description():
    fields = [f.name for f in dataclasses.fields(Settings)]
    assert sorted(v.field for v in VARS) == sorted(fields)
    names = [n for v in VARS for n in v.names]
    assert len(names) == len(set(names)), "an environment name is used twice"
    rows = describe()
    assert len(rows) == len(VARS)
    for name, aliases, _default, meaning in rows:
        assert name and isinstance(aliases, tuple)
        assert len(meaning) > 15, f"{name} has no real description"
    for v in VARS:  # the dataclass default and the documented default agree
        assert getattr(Settings(), v.field) == v.default, v.name


def test_sampling_defaults_match_the_engine():
    engine = pytest.importorskip("dora_primespeech_mlx.engine")
    cfg = engine.SynthesisConfig()
    for key, value in Settings().sampling().items():
        assert getattr(cfg, key) == value, key
    # and the engine accepts every key the node passes
    cfg.replace(**Settings.from_env({"SPEED_FACTOR": "1.2", "STREAM_CHUNK_TOKENS": "20"}).sampling())


def test_dora_string_values():
    s = Settings.from_env({
        "TOP_K": "3", "TOP_P": "1", "TEMPERATURE": "0.8", "SEED": "233333", "SPEED_FACTOR": "1",
        "RETURN_FRAGMENT": "true", "GPTSVITS_WARMUP": "false", "LOG_LEVEL": "warn", "TEXT_LANG": "ZH",
        "FRAGMENT_INTERVAL": "0.2", "NUM_THREADS": "4", "SAMPLE_RATE": "32000", "AUDIO_FORMAT": "Flat",
    })
    assert (s.top_k, s.top_p, s.temperature, s.seed) == (3, 1.0, 0.8, 233333)
    assert isinstance(s.top_p, float) and s.speed_factor == 1.0
    assert s.streaming is True and s.warmup is False
    assert s.log_level == "WARNING" and s.text_lang == "zh" and s.audio_format == "flat"
    assert s.fragment_interval == 0.2 and s.num_threads == 4 and s.sample_rate == 32000
    assert s.sampling()["top_k"] == 3 and s.sampling()["speed_factor"] == 1.0


def test_precedence_old_name_then_aliases_then_default():
    assert Settings.from_env({"GPTSVITS_VOICE": "Maple"}).voice == "Maple"
    assert Settings.from_env({"VOICE_NAME": "Luo Xiang", "GPTSVITS_VOICE": "Maple"}).voice == "Luo Xiang"
    assert Settings.from_env({"VOICE_NAME": "", "GPTSVITS_VOICE": "Maple"}).voice == "Maple"  # empty = unset
    assert Settings.from_env({"STREAMING": "false", "RETURN_FRAGMENT": "true"}).streaming is False
    assert Settings.from_env({"GPTSVITS_STREAMING": "1"}).streaming is True
    assert Settings.from_env({"GPTSVITS_TOP_K": "7"}).top_k == 7
    assert Settings.from_env({"TOP_K": "2", "GPTSVITS_TOP_K": "7"}).top_k == 2
    assert Settings.from_env({"GPTSVITS_MODEL_DIR": "/x/y"}).model_dir == Path("/x/y")
    assert Settings.from_env({"STREAM_CHUNK_TOKENS": "24"}).stream_chunk_tokens == 24
    assert Settings.from_env({"GPTSVITS_CHUNK_SIZE": "4096"}).stream_chunk_tokens == 3  # samples -> tokens (1280 each)
    assert Settings.from_env({"GPTSVITS_CHUNK_SIZE": "51200"}).stream_chunk_tokens == 40  # 1.6 s
    assert Settings.from_env({"GPTSVITS_CHUNK_SIZE": "100"}).stream_chunk_tokens == 1


def test_model_dir_expands_home_and_vars(monkeypatch):
    monkeypatch.setenv("SOME_ROOT", "/opt/m")
    assert Settings.from_env({"PRIMESPEECH_MODEL_DIR": "$SOME_ROOT/ps"}).model_dir == Path("/opt/m/ps")
    assert Settings.from_env({"PRIMESPEECH_MODEL_DIR": "~/m"}).model_dir == Path("~/m").expanduser()


def test_device_and_encoder_switches():
    assert Settings.from_env({"USE_GPU": "false"}).device == "cpu"
    assert Settings.from_env({"USE_GPU": "true"}).device == "gpu"
    assert Settings.from_env({"DEVICE": "mps", "USE_GPU": "false"}).device == "gpu"  # DEVICE wins
    assert Settings.from_env({"DEVICE": "cuda"}).device == "gpu"
    assert Settings.from_env({"GPTSVITS_USE_ANE": "false"}).encoders == "mlx"
    assert Settings.from_env({"GPTSVITS_USE_ANE": "true"}).encoders == "auto"
    assert Settings.from_env({"PRIMESPEECH_ENCODERS": "coreml", "GPTSVITS_USE_ANE": "false"}).encoders == "coreml"


@pytest.mark.parametrize(
    "env",
    [
        {"TOP_K": "abc"}, {"TOP_K": "2.5"}, {"TOP_K": "0"}, {"TOP_P": "0"}, {"TOP_P": "1.5"},
        {"TEMPERATURE": "-1"}, {"STREAMING": "maybe"}, {"LOG_LEVEL": "LOUD"}, {"DEVICE": "tpu"},
        {"PRIMESPEECH_ENCODERS": "ane"}, {"AUDIO_FORMAT": "bytes"}, {"TEXT_LANG": "fr"},
        {"TEXT_SPLIT_METHOD": "cut9"}, {"SEED": "-2"}, {"USE_GPU": "sometimes"}, {"SPEED_FACTOR": "nan"},
        {"PRIMESPEECH_VOCODER_SPIN": "fast"}, {"PRIMESPEECH_VOCODER_SPIN": "2"}, {"PRIMESPEECH_VOCODER_SPIN": "1; rm"},
    ],
)
def test_invalid_values_raise_config_error(env):
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    (name,) = env
    assert name in str(err.value)


def test_every_bad_variable_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"TOP_K": "x", "TEMPERATURE": "hot", "GPTSVITS_WARMUP": "perhaps", "VOICE_NAME": "Maple"})
    msg = str(err.value)
    for name in ("TOP_K", "TEMPERATURE", "GPTSVITS_WARMUP"):
        assert name in msg
    assert "VOICE_NAME" not in msg


def test_a_bad_primary_value_is_not_hidden_by_a_good_alias():
    with pytest.raises(ConfigError, match="TOP_K"):
        Settings.from_env({"TOP_K": "x", "GPTSVITS_TOP_K": "5"})


@pytest.mark.parametrize("env", [
    {"PRIMESPEECH_T2S_COMPILE": "maybe"}, {"PRIMESPEECH_BERT_HALF": "halfish"}, {"PRIMESPEECH_G2PW": "yes please"},
    {"PRIMESPEECH_T2S_DECODE": "gpu-ish"}, {"PRIMESPEECH_CONV_IMPL": "fft"}, {"PRIMESPEECH_THREADS": "0"},
    {"PRIMESPEECH_THREADS": "many"}, {"TOP_K": "2000"}, {"SPEED_FACTOR": "0.2"}, {"PRIMESPEECH_VOICE_CACHE": "-1"},
    {"MAX_QUEUED_TEXTS": "0"}, {"PRIMESPEECH_COREML_COMPUTE_UNITS": "GPU_ONLY"}, {"PRIMESPEECH_DORA_SENDS": "both"},
    {"TEMPERATURE": "11"}, {"NOISE_SCALE": "-1"}, {"STREAM_CHUNK_TOKENS": "1501"},
])
def test_garbage_is_refused_at_start(env):
    (name,) = env
    with pytest.raises(ConfigError, match=name):
        Settings.from_env(env)


def test_settings_ranges_are_the_engines():
    """A value the settings accept is accepted by the engine, and the bounds are the same numbers."""
    from dora_primespeech_mlx import defaults

    engine = pytest.importorskip("dora_primespeech_mlx.engine")
    for field, rng in defaults.RANGES.items():
        var = next((v for v in VARS if v.field == field), None)
        if var is None:
            continue  # a request-only parameter (streaming window shape)
        for x in (rng.lo, rng.hi):
            text = str(int(x)) if rng.integer else repr(float(x))
            ok = rng.contains(x)
            if ok:
                value = var.parse(text)
                engine.SynthesisConfig().replace(**{field: value})
            else:
                with pytest.raises(ValueError):
                    var.parse(text)
                with pytest.raises(ConfigError):
                    engine.SynthesisConfig().replace(**{field: x})


def test_read_one_setting_and_its_errors():
    from dora_primespeech_mlx.settings import read

    assert read("threads", {}) == "auto" and read("threads", {"PRIMESPEECH_THREADS": "3"}) == 3
    assert read("t2s_compile", {"PRIMESPEECH_T2S_COMPILE": "auto"}) is None
    assert read("cache_dir", {"XDG_CACHE_HOME": "/x"}) == Path("/x/dora_primespeech_mlx")
    with pytest.raises(ConfigError, match="PRIMESPEECH_T2S_COMPILE"):
        read("t2s_compile", {"PRIMESPEECH_T2S_COMPILE": "maybe"})
