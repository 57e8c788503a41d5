"""The preset catalog, user voice YAMLs, custom voices and their errors."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import time

import pytest
import yaml

from dora_primespeech_mlx.assets import voicefile
from dora_primespeech_mlx.assets.catalog import (
    MAX_PROMPT_CHARS,
    all_voices,
    broken_voices,
    catalog_options,
    custom_voice,
    list_voices,
    preset_names,
    resolve_voice,
)
from dora_primespeech_mlx.errors import ConfigError, VoiceNotFoundError, VoiceNotInstalledError
from dora_primespeech_mlx.settings import Settings
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


def test_voices_dir_is_passed_not_read_from_the_environment(tmp_path, monkeypatch):
    path = _user_voice(tmp_path / "elsewhere")
    monkeypatch.setenv("PRIMESPEECH_VOICES_DIR", str(path.parent))
    with pytest.raises(VoiceNotFoundError):  # the catalog reads no setting: the entry points pass it
        resolve_voice("Alice", tmp_path)
    assert resolve_voice("Alice", tmp_path, voices_dir=path.parent).source == "user"
    where = catalog_options(Settings.from_env({"PRIMESPEECH_VOICES_DIR": str(path.parent)}))
    assert resolve_voice("Alice", tmp_path, **where).source == "user"
    assert "Alice" in {v.name for v in list_voices(tmp_path, **where)}


def test_the_model_directory_is_required():
    with pytest.raises(TypeError):
        resolve_voice("Doubao")  # no silent fallback to PRIMESPEECH_MODEL_DIR
    with pytest.raises(TypeError):
        list_voices()


def test_custom_voice(tmp_path):
    _user_voice(tmp_path)
    base = resolve_voice("Alice", tmp_path)
    ref = require_fixture("models/ref_audio/e2e_ref_32k.wav")
    spec = custom_voice(ref, "Hello there", "en", base=base, root=tmp_path)
    assert spec.source == "custom" and spec.gpt == base.gpt and spec.prompt_text == "Hello there"
    assert custom_voice(ref, "x", "klingon", base=base, root=tmp_path).language == "auto"
    with pytest.raises(VoiceNotInstalledError, match="reference audio"):
        custom_voice(tmp_path / "none.wav", "x", "en", base=base, root=tmp_path)


# --- voice files read like config files (docs/voices.md, docs/security.md) ---

def _write_user_yaml(root, folder, text):
    path = root / "voices" / folder / "voice.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("typo,near", [("promt_text", "prompt_text"), ("languge", "language"),
                                       ("speedfactor", "speed_factor")])
def test_unknown_key_is_named_with_the_nearest_known_one(tmp_path, monkeypatch, typo, near):
    monkeypatch.setenv("PRIMESPEECH_VOICE_UNKNOWN_KEYS", "warn")  # not read here: the default is "error"
    path = _user_voice(tmp_path)
    data = yaml.safe_load(path.read_text())
    data[typo] = data.pop(near, "x")
    if near == "language":
        data["language"] = "en"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=f"unknown key '{typo}' \\(did you mean '{near}'\\?\\)"):
        resolve_voice("Alice", tmp_path)


def test_unknown_key_setting_warn_keeps_the_voice(tmp_path, monkeypatch, caplog):
    path = _user_voice(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["promt_text"] = data.pop("prompt_text")
    path.write_text(yaml.safe_dump(data))
    with caplog.at_level("WARNING"):
        spec = resolve_voice("Alice", tmp_path, **catalog_options(Settings.from_env(
            {"PRIMESPEECH_VOICE_UNKNOWN_KEYS": "warn"})))
    assert spec.prompt_text == "" and "did you mean 'prompt_text'" in caplog.text


def test_a_broken_voice_file_stops_no_other_voice(tmp_path):
    _user_voice(tmp_path, "Alice")
    _write_user_yaml(tmp_path, "Broken", "name: Broken\nlanguage: en\nreference: r.wav\npromt_text: hi\n")
    _write_user_yaml(tmp_path, "Garbage", "name: [unclosed\n")
    assert resolve_voice("Alice", tmp_path).source == "user"
    assert resolve_voice("Maple", tmp_path, require_installed=False).source == "preset"
    assert "Alice" in all_voices(tmp_path) and "Broken" not in all_voices(tmp_path)
    listed = {v.name: v for v in list_voices(tmp_path)}
    assert listed["Alice"].error == "" and listed["Maple"].error == ""
    assert "promt_text" in listed["Broken"].error and not listed["Broken"].installed
    assert "not a valid voice file" in listed["Garbage"].error
    assert {b.name for b in broken_voices(tmp_path)} == {"Broken", "Garbage"}
    with pytest.raises(ConfigError, match="did you mean 'prompt_text'"):
        resolve_voice("Broken", tmp_path)


def test_cli_voices_lists_a_broken_file_and_succeeds(tmp_path, capsys):
    from dora_primespeech_mlx.cli import main

    _write_user_yaml(tmp_path, "Broken", "name: Broken\nlanguge: en\nreference: r.wav\n")
    assert main(["voices", "--model-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("Broken"))
    assert "broken:" in line and "did you mean 'language'" in line and "Doubao" in out
    assert main(["voices", "--json", "--model-dir", str(tmp_path)]) == 0
    listed = {v["name"]: v for v in json.loads(capsys.readouterr().out)}
    assert "languge" in listed["Broken"]["error"] and listed["Doubao"]["error"] == ""


def _peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_billion_laughs_is_refused_at_once(tmp_path):
    lines = ['a0: &a0 "lol lol lol lol lol lol lol lol lol lol"']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    lines += ["name: *a8", "language: en", "reference: r.wav", "prompt_text: *a8", "description: *a8"]
    _write_user_yaml(tmp_path, "Laughs", "\n".join(lines) + "\n")
    before, t0 = _peak_kb(), time.monotonic()
    listed = {v.name: v for v in list_voices(tmp_path)}
    with pytest.raises(ConfigError, match="aliases"):
        resolve_voice("Laughs", tmp_path)
    assert time.monotonic() - t0 < 5  # the expansion takes several seconds and gigabytes
    assert _peak_kb() - before < 200_000
    assert "aliases" in listed["Laughs"].error


def test_oversized_voice_file_is_refused_by_its_size(tmp_path):
    path = _write_user_yaml(tmp_path, "Huge", "name: Huge\nlanguage: en\nreference: r.wav\nprompt_text: ")
    with open(path, "r+b") as f:  # a sparse 50 MB file: refused from its size, never read
        f.truncate(50 * 1024 * 1024)
    t0 = time.monotonic()
    listed = {v.name: v for v in list_voices(tmp_path)}
    assert time.monotonic() - t0 < 5
    assert f"limit of {voicefile.MAX_FILE_BYTES} bytes" in listed["Huge"].error


def test_many_keys_are_refused(tmp_path):
    body = "".join(f"k{i}: {i}\n" for i in range(voicefile.MAX_KEYS + 1))
    _write_user_yaml(tmp_path, "Keys", "name: Keys\n" + body)
    assert f"at most {voicefile.MAX_KEYS}" in {v.name: v for v in list_voices(tmp_path)}["Keys"].error


def test_a_fifo_voice_file_does_not_block(tmp_path):
    path = tmp_path / "voices" / "Pipe" / "voice.yaml"
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    t0 = time.monotonic()
    assert "regular file" in {v.name: v for v in list_voices(tmp_path)}["Pipe"].error
    assert time.monotonic() - t0 < 5


def test_long_prompt_text_is_refused_everywhere(tmp_path):
    long = "supercalifragilistic " * 2500
    _user_voice(tmp_path, "Alice", prompt_text=long)
    with pytest.raises(ConfigError, match=f"limit is {MAX_PROMPT_CHARS}"):
        resolve_voice("Alice", tmp_path)
    _user_voice(tmp_path, "Bob")
    base = resolve_voice("Bob", tmp_path)
    ref = require_fixture("models/ref_audio/e2e_ref_32k.wav")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="MAX_PROMPT_CHARS"):
        custom_voice(ref, long, "en", base=base, root=tmp_path)
    with pytest.raises(ConfigError, match="MAX_PROMPT_CHARS"):  # the Python API: any VoiceSpec
        dataclasses.replace(base, prompt_text=long)
    assert time.monotonic() - t0 < 1


def test_a_mistyped_voice_name_gets_a_suggestion(tmp_path):
    """"Tinny" gets "did you mean 'Tiny'?" (also across case and spaces), a name like none gets only the list."""
    folder = tmp_path / "voices" / "Tiny"
    folder.mkdir(parents=True)
    (folder / "voice.yaml").write_text("name: Tiny\nlanguage: en\nreference: ref.wav\n", encoding="utf-8")
    for typed, meant in (("Tinny", "Tiny"), ("luo xaing", "Luo Xiang"), ("Doubau", "Doubao"), ("mapel", "Maple")):
        with pytest.raises(VoiceNotFoundError) as exc:
            resolve_voice(typed, tmp_path)
        assert f"unknown voice {typed!r} (did you mean {meant!r}?); known voices:" in str(exc.value)
    with pytest.raises(VoiceNotFoundError) as exc:
        resolve_voice("Nobody At All", tmp_path)
    assert "did you mean" not in str(exc.value) and "known voices: " in str(exc.value)
