"""The reference features on disk (engine/reference_cache.py, ``PRIMESPEECH_REFERENCE_CACHE``): a second engine
with the same voice reads them instead of computing them, gets the same arrays and speaks the same audio; a
damaged file, one written for another key, or a changed clip or prompt is computed again."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil

import numpy as np
import pytest
from conftest import model_cases, param_or_missing, require_case
from test_engine import FAST, fixture_voice

from dora_primespeech_mlx.engine import GPTSoVITSEngine, reference_cache
from dora_primespeech_mlx.settings import Settings

E2E_CASES = model_cases("e2e")
E2E_PARAMS = param_or_missing(E2E_CASES, lambda c: c["name"], "models/cases.json e2e case")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "engine-model-dir"  # (test_engine's: the converted fixture models)
    path.mkdir(exist_ok=True)
    return path


class Counting:
    """An engine whose reference folder is ``folder`` and whose reference builds are counted."""

    def __init__(self, model_dir, folder, monkeypatch):
        settings = dataclasses.replace(Settings.from_env(), reference_cache=True)
        self.engine = GPTSoVITSEngine(model_dir=model_dir, config=FAST, settings=settings)
        assert self.engine.store.reference_cache == settings.cache_dir / "references"  # the setting's folder
        self.engine.store.reference_cache = folder
        self.builds = 0
        real = self.engine.references.build

        def build(*a, **kw):
            self.builds += 1
            return real(*a, **kw)

        monkeypatch.setattr(self.engine.references, "build", build)

    def reference(self, voice):
        eng = self.engine
        eng.load_voice(voice)
        (key,) = eng.cache.keys("reference")
        return eng.cache.peek(key)


def same(a, b) -> None:
    for name in ("prompt_semantic", "prompt_phones", "prompt_bert"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.prompt_norm_text == b.prompt_norm_text and a.seconds == b.seconds
    ge_a, ge_b = np.array(a.ge), np.array(b.ge)
    assert ge_a.dtype == ge_b.dtype
    np.testing.assert_array_equal(ge_a, ge_b)


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_second_start_reads_the_features(case, model_dir, tmp_path, monkeypatch):
    case = require_case(case, "models/cases.json")
    voice = fixture_voice(case)
    first = Counting(model_dir, tmp_path, monkeypatch)
    ref = first.reference(voice)
    assert first.builds == 1 and len(list(tmp_path.glob("reference-*.npz"))) == 1
    (path,) = tmp_path.glob("reference-*.npz")
    os.utime(path, ns=(10**9, 10**9))
    second = Counting(model_dir, tmp_path, monkeypatch)
    again = second.reference(voice)
    assert path.stat().st_mtime_ns > 10**9, "a read marks the file used (the folder keeps the recently used)"
    assert second.builds == 0, "a second start with the same voice must not compute the features again"
    assert second.engine.stats()["reference_computations"] == 0
    same(ref, again)
    text = case["inputs"]["text"]
    a = first.engine.synthesize(text, seed=7, fragment_interval=0.0)
    b = second.engine.synthesize(text, seed=7, fragment_interval=0.0)
    np.testing.assert_array_equal(a.semantic_tokens, b.semantic_tokens)
    np.testing.assert_array_equal(a.audio, b.audio)


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_damaged_or_foreign_files_are_computed_again(case, model_dir, tmp_path, monkeypatch, caplog):
    case = require_case(case, "models/cases.json")
    voice = fixture_voice(case)
    ref = Counting(model_dir, tmp_path, monkeypatch).reference(voice)
    (path,) = tmp_path.glob("reference-*.npz")
    good = path.read_bytes()
    other = dataclasses.replace(voice, prompt_text=voice.prompt_text + voice.prompt_text[-1])
    for damage in (good[: len(good) // 2], b"not a numpy file", None):
        if damage is None:  # another key's file under this name
            Counting(model_dir, tmp_path / "other", monkeypatch).reference(other)
            (foreign,) = (tmp_path / "other").glob("reference-*.npz")
            shutil.copyfile(foreign, path)
        else:
            path.write_bytes(damage)
        counting = Counting(model_dir, tmp_path, monkeypatch)
        with caplog.at_level(logging.DEBUG, logger=reference_cache.__name__):
            caplog.clear()
            again = counting.reference(voice)
        assert counting.builds == 1, "a damaged or foreign file is not used"
        assert any("ignored" in r.getMessage() for r in caplog.records), "one DEBUG line says why"
        same(ref, again)
        assert reference_cache.load(tmp_path, _key(counting, voice)) is not None, "rewritten whole"


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_a_changed_clip_or_prompt_is_another_key(case, model_dir, tmp_path, monkeypatch):
    case = require_case(case, "models/cases.json")
    voice = fixture_voice(case)
    clip = tmp_path / "clip.wav"
    shutil.copyfile(voice.reference, clip)
    voice = dataclasses.replace(voice, reference=clip)
    folder = tmp_path / "refs"
    Counting(model_dir, folder, monkeypatch).reference(voice)
    raw = bytearray(clip.read_bytes())
    raw[-2:] = bytes([raw[-2] ^ 1, raw[-1]])  # the last sample, one bit: same length, other content
    clip.write_bytes(bytes(raw))
    counting = Counting(model_dir, folder, monkeypatch)
    counting.reference(voice)
    assert counting.builds == 1, "a changed clip is computed again"
    counting = Counting(model_dir, folder, monkeypatch)
    counting.reference(dataclasses.replace(voice, prompt_text=voice.prompt_text + voice.prompt_text[-1]))
    assert counting.builds == 1, "another prompt text is computed again"
    assert len(list(folder.glob("reference-*.npz"))) == 3

def _key(counting: Counting, voice) -> str:
    eng = counting.engine
    models = eng.store.models(voice)
    return reference_cache.reference_key(voice, voice.prompt_lang, models.symbol_version, models.sv is not None,
                                         eng.runtime, eng.text_data)


def test_the_folder_keeps_the_most_recently_used(tmp_path):
    """:func:`reference_cache.prune`: the newest files stay (a read counts as a use), the rest go."""
    files = []
    for i in range(5):
        p = tmp_path / f"reference-{i:032x}.npz"
        p.write_bytes(b"x")
        os.utime(p, ns=(i * 10**9, i * 10**9))
        files.append(p)
    os.utime(files[0], ns=(10 * 10**9, 10 * 10**9))  # the oldest file, just read
    assert reference_cache.prune(tmp_path, keep=3) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files[i].name for i in (0, 3, 4))


def test_a_clip_that_is_no_regular_file_is_not_keyed(model_dir, tmp_path, monkeypatch):
    """A FIFO (whose reading may never end) or an oversized file is not read for the key: no disk cache for it."""
    case = require_case(E2E_CASES[0] if E2E_CASES else None, "models/cases.json")
    voice = fixture_voice(case)
    counting = Counting(model_dir, tmp_path, monkeypatch)
    eng = counting.engine
    models = eng.store.models(voice)
    fifo = tmp_path / "clip.fifo"
    os.mkfifo(fifo)
    assert eng.store._disk_key(dataclasses.replace(voice, reference=fifo), models, voice.prompt_lang) is None
    monkeypatch.setattr(reference_cache, "MAX_CLIP_BYTES", 16)
    assert eng.store._disk_key(voice, models, voice.prompt_lang) is None
    monkeypatch.setattr(reference_cache, "MAX_CLIP_BYTES", 64 << 20)
    assert eng.store._disk_key(voice, models, voice.prompt_lang) is not None
