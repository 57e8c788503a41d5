"""The command line: global options anywhere, help with defaults, --version, unknown names answered with the
known ones, and one exact-missing-files message on every offline path (CLI, node start with and without
automatic downloads)."""

from __future__ import annotations

import argparse
import importlib.metadata
import json

import pytest

from dora_primespeech_mlx.assets import download
from dora_primespeech_mlx.assets.catalog import all_voices, preset_names
from dora_primespeech_mlx.cli import build_parser, main
from dora_primespeech_mlx.errors import DownloadError, VoiceNotInstalledError


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    top = build_parser()
    return [("primespeech-mlx", top), *_subparsers(top).items()]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(download, "_HUB_REACHABLE", False)  # never the network from these tests


@pytest.mark.parametrize("command", sorted(_subparsers(build_parser())))
def test_model_dir_before_or_after_every_command(command):
    parser = build_parser()
    sub = _subparsers(parser)[command]
    assert "--model-dir" in sub._option_string_actions, command
    required = [a for a in sub._actions if not a.option_strings and a.nargs not in ("*", "?")]
    positional = ["x"] * len(required)
    before = parser.parse_args(["--model-dir", "/m/before", command, *positional])
    after = parser.parse_args([command, *positional, "--model-dir", "/m/after"])
    neither = parser.parse_args([command, *positional])
    assert before.model_dir == "/m/before" and after.model_dir == "/m/after" and neither.model_dir is None


def test_model_dir_after_the_command_is_used(tmp_path, capsys):
    voice = tmp_path / "voices" / "Zed" / "voice.yaml"
    voice.parent.mkdir(parents=True)
    voice.write_text("name: Zed\nlanguage: en\nreference: ref.wav\n", encoding="utf-8")
    assert main(["voices", "--json", "--model-dir", str(tmp_path)]) == 0
    after = json.loads(capsys.readouterr().out)
    assert main(["--model-dir", str(tmp_path), "voices", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert after == before and "Zed" in {v["name"] for v in after}


def test_every_option_has_help_and_shows_its_default():
    for name, parser in _all_parsers():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help and action.help.strip(), f"{name} {action.dest}: no help"
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                shown = formatter._get_help_string(action) % {"default": action.default}
                assert "default" in shown, (name, action.dest, shown)


def test_help_texts_have_no_markup(capsys):
    for name, parser in _all_parsers():
        text = parser.format_help()
        assert "``" not in text and ":mod:" not in text and ":func:" not in text, name


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    try:
        expected = importlib.metadata.version("dora-primespeech-mlx")
    except importlib.metadata.PackageNotFoundError:
        expected = "unknown"
    assert out == f"primespeech-mlx {expected}"


@pytest.mark.parametrize("argv", [["download", "Nobody"], ["download", "Doubao", "Nobody"],
                                  ["say", "hi", "--voice", "Nobody"], ["say", "hi", "--voice", "'; rm -rf /"]])
def test_unknown_voice_lists_the_known_ones(argv, tmp_path, capsys):
    assert main([*argv, "--model-dir", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "unknown" in err
    known = preset_names() if argv[0] == "download" else list(all_voices(tmp_path / "empty"))
    assert known and all(name in err for name in known)


def _exact_message(tmp_path, voice: str) -> str:
    from dora_primespeech_mlx.assets.catalog import resolve_voice

    with pytest.raises(VoiceNotInstalledError) as exc:
        resolve_voice(voice, tmp_path)
    return str(exc.value)


def test_offline_paths_give_the_same_exact_missing_files(tmp_path, capsys):
    from dora_primespeech_mlx.node import engine_factory
    from dora_primespeech_mlx.settings import Settings

    voice = preset_names()[0]
    expected = _exact_message(tmp_path, voice)
    spec = all_voices(tmp_path)[voice]
    for path in (spec.gpt, spec.sovits, spec.reference):
        assert str(path) in expected  # the files themselves, not only their folders

    with pytest.raises(VoiceNotInstalledError) as manual:  # PRIMESPEECH_AUTO_DOWNLOAD=false
        engine_factory(Settings(voice=voice, model_dir=tmp_path, auto_download=False))(lambda m: None)
    with pytest.raises(DownloadError) as auto:  # the default: download, but offline
        engine_factory(Settings(voice=voice, model_dir=tmp_path))(lambda m: None)
    assert str(manual.value) == expected
    assert expected in str(auto.value) and "cannot reach the Hugging Face Hub" in str(auto.value)

    assert main(["download", voice, "--model-dir", str(tmp_path)]) == 2
    assert expected in capsys.readouterr().err
    assert main(["say", "hi", "--voice", voice, "--model-dir", str(tmp_path)]) == 2
    assert expected in capsys.readouterr().err
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # nothing half-written


def test_offline_encoders_name_every_missing_file(tmp_path):
    from dora_primespeech_mlx.assets.catalog import encoder_info

    enc = encoder_info()
    (tmp_path / "moyoyo" / enc.hubert).mkdir(parents=True)
    present = tmp_path / "moyoyo" / enc.hubert / enc.hubert_files[0]
    present.write_text("{}", encoding="utf-8")
    with pytest.raises(DownloadError) as exc:
        download.download_encoders(tmp_path)
    msg = str(exc.value)
    for f in enc.hubert_files[1:]:
        assert str(tmp_path / "moyoyo" / enc.hubert / f) in msg
    for f in enc.bert_files:
        assert str(tmp_path / "moyoyo" / enc.bert / f) in msg
    assert str(present) not in msg
