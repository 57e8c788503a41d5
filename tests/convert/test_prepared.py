"""The models' prepared forms (convert/load.py, ``PRIMESPEECH_PREPARED_CACHE``): a load that changes how weights are
stored (RoBERTa's and the GPT's float32 weights kept as float16, CNHubert's float16 storage) writes them as loaded;
the next load under the same choices reads that form instead of the float32 file and holds the same arrays; a stale,
damaged, foreign or incomplete form is ignored and written again; an engine speaks the same audio cold and warm."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from dora_primespeech_mlx.convert import load as L
from tests.conftest import load_cases_json, model_cases, param_or_missing, require_case, require_fixture

LOADERS = {"gpt": L.load_gpt, "sovits": L.load_sovits, "hubert": L.load_hubert, "bert": L.load_bert}
E2E_CASES = model_cases("e2e")
E2E_PARAMS = param_or_missing(E2E_CASES, lambda c: c["name"], "models/cases.json e2e case")


def _source(kind: str) -> Path:
    return require_fixture("models/" + load_cases_json()["checkpoints"][kind])


class Reads:
    """Counts the reads of converted float32 weights files."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = L._read_converted

        def counted(path):
            self.n += 1
            return real(path)

        monkeypatch.setattr(L, "_read_converted", counted)


def _load(kind: str, root: Path, prepared: Path | None):
    model = LOADERS[kind](_source(kind), root=root, prepared=prepared)
    return model[0] if kind == "bert" else model


def _arrays(model) -> dict[str, tuple[str, bytes]]:
    out = {}
    for name, v in tree_flatten(model.parameters()):
        mx.eval(v)
        out[name] = (str(v.dtype), np.array(v).tobytes())
    return out


def _forms(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors")) if folder.is_dir() else []


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_second_load_reads_the_prepared_form(kind, tmp_path, monkeypatch):
    reads, prepared = Reads(monkeypatch), tmp_path / "prepared"
    plain = _arrays(_load(kind, tmp_path, None))
    assert reads.n == 1 and not _forms(prepared)
    cold = _load(kind, tmp_path, prepared)
    assert reads.n == 2
    changed = any(dtype != "mlx.core.float32" for dtype, _ in plain.values())
    if not changed:  # nothing transformed at load (SoVITS): nothing written, the float32 file read each time
        assert not _forms(prepared)
        _load(kind, tmp_path, prepared)
        assert reads.n == 3
        return
    (form,) = _forms(prepared)
    assert form.name.startswith(f"{kind}-")
    warm = _load(kind, tmp_path, prepared)
    assert reads.n == 2, "the second load read the float32 file"
    assert _arrays(cold) == plain and _arrays(warm) == plain
    if kind == "gpt":  # the numpy decoder's weights: float16 kernels both times
        assert warm.decoder.half == cold.decoder.half
    if kind == "bert":
        assert (warm.fast_path() is None) == (cold.fast_path() is None)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other key", "a weight missing", "source changed"])
def test_a_bad_or_stale_form_is_ignored_and_written_again(damage, tmp_path, monkeypatch):
    kind = "bert"
    reads, prepared = Reads(monkeypatch), tmp_path / "prepared"
    plain = _arrays(_load(kind, tmp_path, prepared))
    (form,) = _forms(prepared)
    if damage == "garbage":
        form.write_bytes(b"not a safetensors file" * 100)
    elif damage == "truncated":
        form.write_bytes(form.read_bytes()[: form.stat().st_size // 2])
    else:
        weights, meta = mx.load(str(form), format="safetensors", return_metadata=True)
        if damage == "other key":
            meta = {"key": "0" * 64}
        elif damage == "a weight missing":
            weights.pop(sorted(weights)[0])
        else:  # the converted weights rewritten (same bytes, new stamp): another key, this form no longer used
            (converted,) = [p for p in (tmp_path / "mlx").iterdir() if p.name.startswith("bert-")]
            f = converted / "model.safetensors"
            data = f.read_bytes()
            f.unlink()
            f.write_bytes(data)
            from dora_primespeech_mlx.convert import cache as entries

            entries.write_manifest(converted, kind, _source(kind))
        mx.save_safetensors(str(form), weights, metadata=meta)
    n = reads.n
    again = _load(kind, tmp_path, prepared)
    assert reads.n == n + 1, "a bad or stale form was read"
    assert _arrays(again) == plain
    forms = _forms(prepared)
    assert len(forms) == (2 if damage == "source changed" else 1)
    _load(kind, tmp_path, prepared)  # the form written again is read
    assert reads.n == n + 1


def test_unwritable_folder_loads_from_the_float32_file(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    reads = Reads(monkeypatch)
    plain = _arrays(_load("bert", tmp_path, None))
    for _ in range(2):
        assert _arrays(_load("bert", tmp_path, blocked)) == plain
    assert reads.n == 3


@pytest.mark.parametrize("case", E2E_PARAMS)
def test_engine_speaks_the_same_cold_and_warm(case, tmp_path, monkeypatch):
    """Three engines on one case: prepared forms off, then on with an empty folder (written), then on again (read:
    no float32 file of the GPT, RoBERTa or CNHubert is read): the same tokens and the same samples."""
    from dora_primespeech_mlx.engine import GPTSoVITSEngine
    from dora_primespeech_mlx.settings import Settings
    from tests.engine.test_engine import FAST, fixture_voice, golden_settings

    case = require_case(case, "models/cases.json")
    read_kinds: list[str] = []
    real = L._read_converted

    def counted(path):
        read_kinds.append(Path(path).parent.name.split("-")[0])
        return real(path)

    monkeypatch.setattr(L, "_read_converted", counted)
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    base = Settings.from_env()
    results, reads = [], []
    for on in (False, True, True):
        settings = dataclasses.replace(base, prepared_cache=on, cache_dir=tmp_path / "cache")
        read_kinds.clear()
        eng = GPTSoVITSEngine(model_dir=model_dir, config=FAST, settings=settings)
        assert eng.store.prepared == (tmp_path / "cache" / "prepared" if on else None)
        results.append(eng.synthesize(case["inputs"]["text"], voice=fixture_voice(case), **golden_settings(case)))
        reads.append(set(read_kinds))
    written = {f.name.split("-")[0] for f in _forms(tmp_path / "cache" / "prepared")}
    assert "gpt" in reads[0] and written == reads[1] & {"gpt", "bert", "hubert"}  # (RoBERTa: for a Chinese text)
    assert reads[2] == reads[1] - written, f"the warm engine read float32 files: {reads}"
    first = results[0]
    for r in results[1:]:
        np.testing.assert_array_equal(r.semantic_tokens, first.semantic_tokens)
        assert r.audio.dtype == first.audio.dtype and r.audio.tobytes() == first.audio.tobytes()
