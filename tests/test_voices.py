"""The preset catalog, user voice YAMLs, custom voices and their errors."""

from __future__ import annotations

import pytest
import yaml

from dora_primespeech_mlx.assets.catalog import custom_voice, list_voices, preset_names, resolve_voice
from dora_primespeech_mlx.errors import ConfigError, VoiceNotFoundError, VoiceNotInstalledError
from tests.conftest import require_fixture


def test_catalog_has_the_15_presets():
    names = preset_names()
    assert len(names) == 15 and len(set(names)) == 15
    assert {"Doubao", "Luo Xiang", "Maple", "Trump"} <= set(names)


def test_unknown_voice_lists_known_ones(tmp_path):
    with pytest.raises(VoiceNotFoundError, match="Doubao"):
        resolve_voice("Nobody", tmp_path)


def test_names_match_loosely(tmp_path):
    assert resolve_voice("luo_xiang", tmp_path, require_installed=False).name == "Luo Xiang"
    assert resolve_voice("LUOXIANG", tmp_path, require_installed=False).name == "Luo Xiang"


def test_missing_files_give_instructions(tmp_path):
    with pytest.raises(VoiceNotInstalledError) as exc:
        resolve_voice("Maple", tmp_path)
    assert "primespeech-mlx download 'Maple'" in str(exc.value)
    assert str(tmp_path) in str(exc.value)


def _user_voice(root, name="Alice", **extra):
    models = require_fixture("models")
    folder = root / "voices" / name
    folder.mkdir(parents=True)
    data = {
        "name": name,
        "language": "en",
        "prompt_text": "Good morning, this is my voice",
        "reference": str(models / "ref_audio" / "e2e_ref_32k.wav"),
        "gpt": str(next((models / "gpt").glob("*.ckpt"))),
        "sovits": str(next((models / "sovits").glob("*.pth"))),
        "hubert": str(models / "chinese-hubert-tiny"),
        "bert": str(models / "chinese-roberta-tiny"),
        **extra,
    }
    (folder / "voice.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    return folder / "voice.yaml"


def test_user_voice_yaml(tmp_path):
    _user_voice(tmp_path)
    spec = resolve_voice("Alice", tmp_path)
    assert spec.source == "user" and spec.installed and spec.prompt_lang == "en"
    assert any(v.name == "Alice" and v.installed for v in list_voices(tmp_path))


def test_user_voice_relative_paths(tmp_path):
    models = require_fixture("models")
    path = _user_voice(tmp_path, "Bob")
    (path.parent / "ref.wav").write_bytes((models / "ref_audio" / "e2e_ref_32k.wav").read_bytes())
    data = yaml.safe_load(path.read_text())
    data["reference"] = "ref.wav"
    path.write_text(yaml.safe_dump(data))
    assert resolve_voice("Bob", tmp_path).reference == path.parent / "ref.wav"


@pytest.mark.parametrize(
    "bad,match",
    [({"language": "xx"}, "not supported"), ({"speed_factor": "fast"}, "number"), ({"speed_factor": 9}, "outside")],
)
def test_invalid_user_voice(tmp_path, bad, match):
    _user_voice(tmp_path, **bad)
    with pytest.raises(ConfigError, match=match):
        resolve_voice("Alice", tmp_path)


def test_voices_dir_env(tmp_path, monkeypatch):
    path = _user_voice(tmp_path / "elsewhere")
    monkeypatch.setenv("PRIMESPEECH_VOICES_DIR", str(path.parent))
    assert resolve_voice("Alice", tmp_path).source == "user"


def test_custom_voice(tmp_path):
    _user_voice(tmp_path)
    base = resolve_voice("Alice", tmp_path)
    ref = require_fixture("models/ref_audio/e2e_ref_32k.wav")
    spec = custom_voice(ref, "Hello there", "en", base=base, root=tmp_path)
    assert spec.source == "custom" and spec.gpt == base.gpt and spec.prompt_text == "Hello there"
    assert custom_voice(ref, "x", "klingon", base=base, root=tmp_path).language == "auto"
    with pytest.raises(VoiceNotInstalledError, match="reference audio"):
        custom_voice(tmp_path / "none.wav", "x", "en", base=base, root=tmp_path)
