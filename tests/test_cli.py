"""The command line: global options anywhere, help with defaults, --version, unknown names answered with the
known ones, one exact-missing-files message on every offline path (CLI, node start with and without
automatic downloads), mistakes answered before any model loads, one line for a user error or Ctrl-C, and a
command whose module cannot be imported reported."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, fixtures_root, require_fixture

from dora_primespeech_mlx import cli
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
    files = expected.split("\n\n")[0].split("\nOr copy")[0]  # the headline and the missing files
    assert files in str(auto.value) and "cannot reach the Hugging Face Hub" in str(auto.value)
    # offline, the command that fixes it runs on another machine: the download is not advised as if it could work
    assert "Fix (needs internet access" in expected and "Fix (" not in str(auto.value)
    assert "on a machine with internet access" in str(auto.value)
    assert str(auto.value).rstrip().endswith(expected.rstrip().splitlines()[-1].strip())  # the command, last

    assert main(["download", voice, "--model-dir", str(tmp_path)]) == 2
    assert files in capsys.readouterr().err
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


# -- cheap checks before the models load ------------------------------------------------------------------------

def _no_engine(monkeypatch):
    """Building an engine (the model loader) fails the test: every case below must be answered before it."""
    import dora_primespeech_mlx.engine as engine

    def refuse(*args, **kwargs):
        raise AssertionError("the engine was built: the models would load before the mistake is reported")

    monkeypatch.setattr(engine, "GPTSoVITSEngine", refuse)


def _say_mistakes(tmp_path: Path) -> list[tuple[list[str], str]]:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    return [
        (["say", ""], "nothing to speak"),
        (["say", "...!!"], "nothing to speak"),
        (["say", "<think>only reasoning</think>"], "nothing to speak"),
        (["say", "hi", "--speed", "10"], "--speed 10"),
        (["say", "hi", "--top-p", "0"], "--top-p"),
        (["say", "hi", "--top-k", "0"], "--top-k"),
        (["say", "hi", "--temperature", "nan"], "--temperature"),
        (["say", "hi", "--split", "cut9"], "--split cut9"),
        (["say", "hi", "--lang", "xx"], "'xx'"),
        (["say", "hi", "-o", str(tmp_path / "no" / "such" / "dir" / "x.wav")], "does not exist"),
        (["say", "hi", "-o", str(folder)], "is a folder"),
        (["say", "hi", "-o", str(tmp_path / "x.ogg")], ".wav"),
        (["say", "hi", "--voice", "Nobody"], "unknown voice"),
        (["say", "hi", "--voice", "Doubau"], "unknown voice 'Doubau' (did you mean 'Doubao'?)"),
    ]


def test_say_answers_mistakes_before_loading(tmp_path, monkeypatch, capsys):
    _no_engine(monkeypatch)
    for argv, expected in _say_mistakes(tmp_path):
        assert main([*argv, "--model-dir", str(tmp_path / "models")]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and expected in err, (argv, err)
        assert "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_say_refuses_a_folder_it_cannot_write(tmp_path, monkeypatch, capsys):
    _no_engine(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["say", "hi", "-o", str(locked / "x.wav"), "--model-dir", str(tmp_path)]) == 2
    finally:
        locked.chmod(0o700)
    assert "cannot write in the folder" in capsys.readouterr().err


def test_say_mistakes_need_no_model_code(tmp_path):
    """In a fresh process, empty text and an unwritable output are answered without importing MLX or the
    engine (what takes seconds to load), so the answer comes at once."""
    probe = (
        "import sys\n"
        "from dora_primespeech_mlx.cli import main\n"
        f"codes = [main(['say', '', '--model-dir', {str(tmp_path)!r}]),\n"
        f"         main(['say', 'hi', '-o', {str(tmp_path / 'no' / 'x.wav')!r}, '--model-dir', {str(tmp_path)!r}])]\n"
        "heavy = sorted(m for m in sys.modules if m in ('mlx', 'mlx.core', 'onnxruntime')\n"
        "               or m.startswith(('dora_primespeech_mlx.engine', 'dora_primespeech_mlx.models')))\n"
        "print(codes, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 2] []", out.stdout + out.stderr
    assert "nothing to speak" in out.stderr and "does not exist" in out.stderr


# -- one line for a user error, an interrupt, an unavailable command --------------------------------------------

@pytest.mark.parametrize("exc", [PermissionError(13, "Permission denied", "/x"), DownloadError("no network"),
                                 ValueError("bad value")])
def test_a_user_error_is_one_line(exc, monkeypatch, capsys):
    def fail(args):
        raise exc

    monkeypatch.setattr(cli, "cmd_voices", fail)
    assert main(["voices"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {exc}\n"


def test_a_bug_keeps_its_traceback(monkeypatch):
    def fail(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "cmd_voices", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["voices"])


def test_an_interrupt_is_one_line(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_voices", interrupted)
    try:
        code = main(["voices"])
    except KeyboardInterrupt:
        pytest.fail("main() let the KeyboardInterrupt through (a traceback for the user)")
    assert code == 130
    assert capsys.readouterr().err == "primespeech-mlx: interrupted\n"


def test_ctrl_c_while_loading_ends_with_one_line_and_130(tmp_path):
    """SIGINT to a real `primespeech-mlx say` while it loads the fixture voice's models."""
    require_fixture("models/cases.json")
    from wheel_check import VOICE, write_voice

    case = write_voice(tmp_path / "models", fixtures_root())
    proc = subprocess.Popen(
        [sys.executable, "-m", "dora_primespeech_mlx.cli", "say", case["inputs"]["text"], "--voice", VOICE,
         "--model-dir", str(tmp_path / "models"), "-o", str(tmp_path / "x.wav")],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        seen = []
        for line in proc.stderr:  # the engine's first progress line: the models are loading now
            seen.append(line)
            if line.startswith("loading"):
                break
        assert seen and seen[-1].startswith("loading"), "".join(seen)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rest == "primespeech-mlx: interrupted\n", rest
    assert not (tmp_path / "x.wav").exists()


def test_a_command_whose_module_fails_to_import_is_reported(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "dora_primespeech_mlx.cluster_keys", None)  # import fails: ImportError
    sub = _subparsers(build_parser())
    assert "cluster-keys" in sub and "unavailable" in build_parser().format_help()
    assert main(["cluster-keys", "somewhere", "--machine", "a=b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the cluster-keys command is unavailable") and "cluster_keys" in err
    assert main(["voices", "--model-dir", "/nonexistent"]) == 0  # the other commands still work


def test_the_cli_reads_the_places_once_and_passes_them_down(tmp_path, monkeypatch, capsys):
    """The model directory and the voice settings come from the environment at the CLI (resolve_places) and
    reach every command, export-coreml included: a user voice in PRIMESPEECH_VOICES_DIR is listed and found."""
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "zed.yaml").write_text("name: Zed\nlanguage: en\nreference: ref.wav\npromt_text: hi\n", encoding="utf-8")
    monkeypatch.setenv("PRIMESPEECH_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("PRIMESPEECH_VOICES_DIR", str(extra))
    monkeypatch.setenv("PRIMESPEECH_VOICE_UNKNOWN_KEYS", "warn")
    assert main(["voices", "--json"]) == 0
    listed = {v["name"]: v for v in json.loads(capsys.readouterr().out)}
    assert listed["Zed"]["source"] == "user" and listed["Zed"]["error"] == ""
    assert main(["export-coreml", "Zed"]) == 2  # found (a known voice), but not installed in the model directory
    err = capsys.readouterr().err
    assert "voice 'Zed' is not installed" in err and str(extra / "ref.wav") in err
    monkeypatch.setenv("PRIMESPEECH_VOICE_UNKNOWN_KEYS", "error")
    assert main(["voices", "--json"]) == 0
    assert "promt_text" in {v["name"]: v for v in json.loads(capsys.readouterr().out)}["Zed"]["error"]
