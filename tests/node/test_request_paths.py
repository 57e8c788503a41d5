"""Paths that arrive in texts (``VOICE:CUSTOM`` / ``VOICE:TRAINED``) are hostile input: they may name only files
inside the folders of ``PRIMESPEECH_REQUEST_PATHS`` (default: the model directory and ``PRIMESPEECH_VOICES_DIR``),
are taken literally (no ``$VAR``, no ``~``), are resolved (symlinks, ``..``) before the check, and every refusal
reads the same whether the file exists or not, without the file's contents or any variable's value — in
``segment_complete``, ``status``, ``log`` and the node's stderr."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_handler import completes, make_handler, text
from tiny_voice import VOICE, checkpoint, make_model_dir, reference_wav

from dora_primespeech_mlx.assets.catalog import custom_voice, resolve_voice
from dora_primespeech_mlx.errors import ConfigError, RequestPathError
from dora_primespeech_mlx.node import engine_factory
from dora_primespeech_mlx.paths import request_path, request_roots
from dora_primespeech_mlx.settings import Settings

SECRET = "s3cr3t-value-0xC0FFEE"
MESSAGE_TAIL = "not found, or not inside the folders that per-request voices may read (PRIMESPEECH_REQUEST_PATHS)"


@pytest.fixture
def tree(tmp_path):
    """allowed/ (with a file and a link to a file outside), outside/ (a file), and a variable naming outside/."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    (allowed / "sub" / "ok.wav").write_bytes(b"RIFF")
    (outside / "secret.txt").write_text(f"root:x:0:0:{SECRET}\n")
    (allowed / "escape.wav").symlink_to(outside / "secret.txt")
    (allowed / "dir-escape").symlink_to(outside)
    return allowed, outside


def refused(raw, roots, what="reference audio") -> str:
    with pytest.raises(RequestPathError) as info:
        request_path(raw, roots, what)
    message = str(info.value)
    assert message.startswith(f"{what} '") and message.endswith(f"': {MESSAGE_TAIL}"), message
    assert SECRET not in message and "root:x" not in message
    return message


def test_files_inside_the_folders_pass_resolved(tree, monkeypatch):
    allowed, _ = tree
    roots = request_roots(allowed, None, None)
    assert request_path(allowed / "sub" / "ok.wav", roots, "x") == (allowed / "sub" / "ok.wav").resolve()
    assert request_path(f"{allowed}/sub/../sub/ok.wav", roots, "x") == (allowed / "sub" / "ok.wav").resolve()
    monkeypatch.chdir(allowed)
    assert request_path("sub/ok.wav", roots, "x") == (allowed / "sub" / "ok.wav").resolve()  # relative: from cwd


def test_hostile_paths_are_refused_alike(tree, monkeypatch):
    allowed, outside = tree
    roots = request_roots(allowed, None, None)
    monkeypatch.setenv("SOME_SECRET", str(outside / "secret.txt"))
    monkeypatch.setenv("SECRET_DIR", str(outside))
    monkeypatch.setenv("HOME", str(outside))
    hostile = [
        "$SOME_SECRET", "${SOME_SECRET}", "$SECRET_DIR/secret.txt", "~/secret.txt",  # no expansion
        f"{allowed}/../outside/secret.txt", f"{allowed}/sub/../../outside/secret.txt",  # traversal
        str(allowed / "escape.wav"), str(allowed / "dir-escape" / "secret.txt"),  # symlinks out of the folder
        "/etc/passwd", str(outside / "secret.txt"),  # existing, readable, outside
        str(outside / "missing.wav"), str(allowed / "missing.wav"), str(allowed / "sub"),  # missing / not a file
        "", "   ", "a\0b", "x" * 5000,
    ]
    messages = {raw: refused(raw, roots) for raw in hostile}
    # existing-but-forbidden and nonexistent read the same, up to the text the request gave itself
    shapes = {m.replace(repr(raw.strip()), "<PATH>") for raw, m in messages.items() if len(raw) < 120}
    assert len(shapes) == 1, shapes
    long = messages["x" * 5000]
    assert len(long) < 300 and "..." in long


def test_the_setting(tmp_path, monkeypatch):
    model, voices, extra = tmp_path / "m", tmp_path / "v", tmp_path / "e"
    for d in (model, voices, extra):
        d.mkdir()
    assert request_roots(model, None, None) == (model.resolve(),)
    assert request_roots(model, voices, None) == (model.resolve(), voices.resolve())
    assert request_roots(model, voices, "*") is None
    monkeypatch.setenv("EXTRA_DIR", str(extra))
    s = Settings.from_env({"PRIMESPEECH_REQUEST_PATHS": f"$EXTRA_DIR{os.pathsep}{voices}"})  # config: expanded
    assert s.request_paths == (extra, voices)
    assert request_roots(model, None, s.request_paths) == (extra.resolve(), voices.resolve())
    assert Settings.from_env({"PRIMESPEECH_REQUEST_PATHS": " * "}).request_paths == "*"
    assert Settings.from_env({}).request_paths is None
    with pytest.raises(ConfigError, match="PRIMESPEECH_REQUEST_PATHS"):
        Settings.from_env({"PRIMESPEECH_REQUEST_PATHS": os.pathsep})
    (extra / "a.wav").write_bytes(b"x")
    assert request_path(extra / "a.wav", None, "x") == (extra / "a.wav").resolve()  # `*`: anywhere


def test_custom_voice_checks_every_path(tmp_path):
    model = make_model_dir(tmp_path / "models")
    base = resolve_voice(VOICE, model)
    roots = request_roots(model, None, None)
    with pytest.raises(RequestPathError, match="reference audio"):
        custom_voice(reference_wav(), "hi", "en", base=base, root=model, roots=roots)  # the fixtures: outside
    shutil.copy(reference_wav(), model / "ref.wav")
    spec = custom_voice(model / "ref.wav", "hi", "en", base=base, root=model, roots=roots)
    assert spec.reference == (model / "ref.wav").resolve()
    for gpt, sovits, what in ((checkpoint("gpt"), None, "GPT checkpoint"), (None, "/etc/passwd", "SoVITS checkpoint")):
        with pytest.raises(RequestPathError, match=what):
            custom_voice(model / "ref.wav", "hi", "en", gpt=gpt, sovits=sovits, base=base, root=model, roots=roots)


# -- through the node's handler, with the real engine -------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model = make_model_dir(tmp_path_factory.mktemp("models"))
    shutil.copy(reference_wav(), model / "ref.wav")
    (model / "notes.ckpt").write_text(f"root:x:0:0:{SECRET}\n")  # inside, but not a checkpoint
    (model / "notes.wav").write_text(f"root:x:0:0:{SECRET}\n")  # inside, but not audio
    return model


@pytest.fixture(scope="module")
def shared_engine(model_dir):
    settings = Settings.from_env({"VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir),
                                  "GPTSVITS_WARMUP": "false", "TOP_K": "1"})
    return engine_factory(settings)(lambda message: None)


def test_node_answers_hostile_paths_without_leaking(model_dir, shared_engine, tmp_path, monkeypatch, capfd):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"root:x:0:0:{SECRET}\n")
    (model_dir / "link.wav").unlink(missing_ok=True)
    (model_dir / "link.wav").symlink_to(outside / "secret.txt")
    monkeypatch.setenv("SOME_SECRET", SECRET)
    monkeypatch.setenv("SECRET_FILE", str(outside / "secret.txt"))
    handler, rec = make_handler(model_dir, shared_engine)
    ref, gpt, sovits = model_dir / "ref.wav", checkpoint("gpt"), checkpoint("sovits")
    cases = {
        "var": "VOICE:CUSTOM|$SOME_SECRET|hi|en|Hello there.",
        "var-file": "VOICE:CUSTOM|$SECRET_FILE|hi|en|Hello there.",
        "home": "VOICE:CUSTOM|~/x.wav|hi|en|Hello there.",
        "traversal": f"VOICE:CUSTOM|{model_dir}/../../../../../../etc/passwd|hi|en|Hello there.",
        "symlink": f"VOICE:CUSTOM|{model_dir}/link.wav|hi|en|Hello there.",
        "passwd": f"VOICE:TRAINED|/etc/passwd|/etc/passwd|{ref}|hi|en|Hello there.",
        "exists": f"VOICE:TRAINED|{gpt}|{sovits}|{ref}|hi|en|Hello there.",  # real checkpoints, outside
        "missing": f"VOICE:TRAINED|/nonexistent/gpt.ckpt|/nonexistent/s.pth|{ref}|hi|en|Hello there.",
        "inside-text": f"VOICE:TRAINED|{model_dir}/notes.ckpt|{model_dir}/notes.ckpt|{ref}|hi|en|Hello there.",
        "inside-wav": f"VOICE:CUSTOM|{model_dir}/notes.wav|hi|en|Hello there.",
        "good": f"VOICE:CUSTOM|{ref}|hi|en|Hello there.",
    }
    for i, (name, value) in enumerate(cases.items()):
        text(handler, value, question_id=name, segment_index=i)
    rec.wait(lambda r: len(completes(r)) == len(cases))
    assert handler.finish(60)
    got = {m["question_id"]: (a.to_pylist()[0], m) for a, m in completes(rec)}
    assert got["good"][0] == "completed"
    for name in cases:
        if name != "good":
            assert got[name][0] == "error", name
    for name in ("var", "var-file", "home", "traversal", "symlink", "passwd", "exists", "missing"):
        assert got[name][1]["error_stage"] == "voice" and got[name][1]["error"].endswith(MESSAGE_TAIL), name
    # existing-but-forbidden and nonexistent: the same answer, but for the path the request gave
    assert (got["exists"][1]["error"].replace(repr(str(gpt)), "P")
            == got["missing"][1]["error"].replace(repr("/nonexistent/gpt.ckpt"), "P"))
    assert repr("~/x.wav") in got["home"][1]["error"] and repr("$SOME_SECRET") in got["var"][1]["error"]
    # inside the folders: a text file as checkpoint is refused without its bytes (the loader quotes them)
    assert got["inside-text"][1]["error"].startswith("VOICE:TRAINED: the files it names cannot be loaded")
    everything = json.dumps([[o, a.to_pylist(), m] for o, a, m in rec.sent], default=str) + capfd.readouterr().err
    for leak in (SECRET, "root:x", "b'ro'", str(outside)):
        assert leak not in everything, leak
