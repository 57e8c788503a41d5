"""The converted-model cache under ``<model_dir>/mlx/``: finite weights only, entries sealed by a manifest written
last and served only when whole, per-request entries bounded (least recently used out)."""

from __future__ import annotations

import gc
import io
import os
import pickletools
import struct
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dora_primespeech_mlx.convert import cache as entries
from dora_primespeech_mlx.convert import load as L
from dora_primespeech_mlx.convert.torch_pickle import CheckpointError
from dora_primespeech_mlx.settings import Settings
from tests.conftest import load_cases_json, require_fixture


def _gpt() -> Path:
    return require_fixture(f"models/{load_cases_json()['checkpoints']['gpt']}")


def rewrite(src: Path, dst: Path, storage: bytes | None = None, negative_offset: bool = False) -> Path:
    """A copy of the torch.save archive ``src``: storage ``data/0`` filled with ``storage`` (repeated), or the
    first tensor's storage offset made -12."""
    with zipfile.ZipFile(src) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    for name in members:
        if storage is not None and name.endswith("/data/0"):
            members[name] = (storage * (len(members[name]) // len(storage) + 1))[: len(members[name])]
        if negative_offset and name.endswith("data.pkl"):
            pkl = members[name]
            ops = list(pickletools.genops(pkl))
            i = next(i for i, (op, _, _) in enumerate(ops) if op.name == "BINPERSID") + 1
            start, end = ops[i][2], ops[i + 1][2]
            members[name] = pkl[:start] + b"J" + struct.pack("<i", -12) + pkl[end:]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name), data)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(buf.getvalue())
    return dst


NAN16 = struct.pack("<e", float("nan"))


def _entries(root: Path) -> list[Path]:
    base = root / "mlx"
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")) if base.is_dir() else []


def _finite(model) -> bool:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    return all(bool(mx.all(mx.isfinite(v)).item()) for _, v in tree_flatten(model.parameters())
               if mx.issubdtype(v.dtype, mx.floating))


def test_non_finite_weights_are_refused_and_nothing_is_cached(tmp_path):
    bad = rewrite(_gpt(), tmp_path / "src" / "nan.ckpt", storage=NAN16)
    root = tmp_path / "root"
    with pytest.raises(CheckpointError, match="NaN or infinite") as exc:
        L.load(bad, "gpt", root=root)
    assert "nan.ckpt" in str(exc.value)
    assert _entries(root) == []
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        L.load(bad, "gpt", cache=False)


def test_conversion_writes_the_manifest_last_and_only_complete_entries_are_served(tmp_path):
    root = tmp_path / "root"
    model = L.load(_gpt(), "gpt", root=root)
    (entry,) = _entries(root)
    assert entries.is_complete(entry)
    meta = entries.manifest(entry)
    assert {"config.json", "model.safetensors"} <= set(meta["files"]) and meta["weights"] == "finite"
    manifest_time = (entry / entries.MANIFEST).stat().st_mtime_ns
    assert all((entry / n).stat().st_mtime_ns <= manifest_time for n in meta["files"])
    del model
    gc.collect()

    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # half written
    assert not entries.is_complete(entry)
    model = L.load(_gpt(), "gpt", root=root)  # converted again, not served half
    assert entries.is_complete(entry) and _finite(model)


def test_a_poisoned_entry_without_a_manifest_is_rebuilt(tmp_path):
    """An entry of the old reader (no manifest) holding non-finite weights is converted again, not served."""
    from safetensors.numpy import load_file, save_file

    root = tmp_path / "root"
    L.load(_gpt(), "gpt", root=root)
    gc.collect()
    (entry,) = _entries(root)
    poisoned = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
                for k, v in load_file(str(entry / "model.safetensors")).items()}
    save_file(poisoned, str(entry / "model.safetensors"))
    (entry / entries.MANIFEST).unlink()
    model = L.load(_gpt(), "gpt", root=root)
    assert _finite(model) and entries.is_complete(entry)


def test_an_entry_that_fails_to_load_is_discarded(tmp_path):
    root = tmp_path / "root"
    L.load(_gpt(), "gpt", root=root)
    gc.collect()
    (entry,) = _entries(root)
    cfg = entry / "config.json"
    stamp = entries.manifest(entry)["files"]["config.json"]
    text = cfg.read_text().replace('"kind": "gpt"', '"kind": "xyz"')
    cfg.write_text(text + " " * (stamp["size"] - len(text.encode())))
    os.utime(cfg, ns=(stamp["mtime_ns"], stamp["mtime_ns"]))  # passes the manifest, fails to build
    assert entries.is_complete(entry)
    with pytest.raises(CheckpointError, match="holds a xyz model"):
        L.load(_gpt(), "gpt", root=root)
    assert not entry.exists()
    assert _finite(L.load(_gpt(), "gpt", root=root))


def test_setting_default_and_range():
    assert Settings().max_converted_models == 8
    assert Settings.from_env({"PRIMESPEECH_CONVERTED_CACHE": "3"}).max_converted_models == 3
    assert Settings.from_env({"GPTSVITS_CONVERTED_CACHE": "0"}).max_converted_models == 0
    with pytest.raises(ValueError, match="PRIMESPEECH_CONVERTED_CACHE"):
        Settings.from_env({"PRIMESPEECH_CONVERTED_CACHE": "-1"})


def test_per_request_entries_are_bounded_lru(tmp_path, monkeypatch):
    """Keeping 2 (``keep_converted``, the engine's PRIMESPEECH_CONVERTED_CACHE), five per-request checkpoints leave
    the two most recently used (and the one still loaded); the catalog's files under <model_dir>/moyoyo are not
    counted. The environment is not read here: the engine passes the setting."""
    monkeypatch.setenv("PRIMESPEECH_CONVERTED_CACHE", "0")  # ignored: would remove every entry not held
    root = tmp_path / "root"
    src = _gpt().read_bytes()
    pinned = root / "moyoyo" / "GPT_weights" / "preset.ckpt"
    pinned.parent.mkdir(parents=True)
    pinned.write_bytes(src)
    L.load(pinned, "gpt", root=root, keep_converted=2)
    files = []
    for i in range(5):
        f = tmp_path / "requests" / f"trained{i}.ckpt"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(src)
        files.append(f)
    kept_alive = L.load(files[0], "gpt", root=root, keep_converted=2)  # loaded in this process all along
    for f in files[1:]:
        m = L.load(f, "gpt", root=root, keep_converted=2)
        del m
        gc.collect()
        time.sleep(0.02)  # distinct use times
    names = {p.name.split("-")[1] for p in _entries(root)}
    assert names == {"preset", "trained0", "trained3", "trained4"}, names
    L.load(files[3], "gpt", root=root, keep_converted=2)  # a use: trained3 is now the most recent
    gc.collect()
    time.sleep(0.02)
    del kept_alive
    gc.collect()
    L.load(files[1], "gpt", root=root, keep_converted=2)  # converted again; trained0 no longer held, trained4 oldest
    gc.collect()
    names = {p.name.split("-")[1] for p in _entries(root)}
    assert names == {"preset", "trained1", "trained3"}, names


def _temp_folder(base: Path, name: str, age: float) -> Path:
    folder = base / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"partial")
    old = time.time() - age
    for p in (folder / "model.safetensors", folder):
        os.utime(p, (old, old))
    return folder


def test_stale_temporary_folders_are_removed(tmp_path):
    root = tmp_path / "root"
    stale = _temp_folder(root / "mlx", ".gpt-x-123.abcd", 2 * entries.TEMP_FOLDER_MAX_IDLE_SECONDS)
    fresh = _temp_folder(root / "mlx", ".gpt-y-456.efgh", 0)
    entries.prune(root, keep=8)
    assert not stale.exists() and fresh.exists()


def test_a_killed_conversions_folder_is_removed_at_the_next_use_of_the_cache(tmp_path):
    """A start that finds its models converted (no conversion, no prune) still clears what a kill -9 left; a
    folder a live conversion is writing (recent writes, even in an old folder) is left alone."""
    root = tmp_path / "root"
    L.load(_gpt(), "gpt", root=root)
    gc.collect()
    killed = _temp_folder(root / "mlx", ".gpt-x-123.abcd", entries.TEMP_FOLDER_MAX_IDLE_SECONDS + 60)
    live = _temp_folder(root / "mlx", ".gpt-y-456.efgh", 2 * entries.TEMP_FOLDER_MAX_IDLE_SECONDS)
    (live / "config.json").write_text("{}")  # written just now
    L.load(_gpt(), "gpt", root=root)  # served from the cache
    assert not killed.exists() and live.exists()


def test_a_replaced_checkpoint_with_the_same_size_and_time_is_converted_again(tmp_path):
    """The cache is keyed by the original's content, not its size and modification time."""
    from safetensors.numpy import load_file

    def values(entry: Path) -> set[float]:
        return {float(v.flat[0]) for v in load_file(str(entry / "model.safetensors")).values()
                if v.dtype.kind == "f" and v.size and np.all(v == v.flat[0])}

    root = tmp_path / "root"
    first = rewrite(_gpt(), tmp_path / "src" / "voice.ckpt", storage=struct.pack("<e", 0.25))
    second = rewrite(_gpt(), tmp_path / "other" / "voice.ckpt", storage=struct.pack("<e", 0.5))
    assert first.stat().st_size == second.stat().st_size
    L.load(first, "gpt", root=root)
    gc.collect()
    (entry,) = _entries(root)
    assert 0.25 in values(entry) and 0.5 not in values(entry)
    stamp = first.stat()
    first.write_bytes(second.read_bytes())
    os.utime(first, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # same size, same time, other weights
    assert not entries.is_complete(entry)
    L.load(first, "gpt", root=root)
    gc.collect()
    (entry,) = _entries(root)
    assert 0.5 in values(entry) and 0.25 not in values(entry)


def test_hostile_geometry_in_a_real_gpt_is_refused_before_caching(tmp_path):
    bad = rewrite(_gpt(), tmp_path / "src" / "offset.ckpt", negative_offset=True)
    root = tmp_path / "root"
    with pytest.raises(CheckpointError, match="negative storage offset"):
        L.load(bad, "gpt", root=root)
    assert _entries(root) == []


def test_the_engine_passes_its_settings_down(tmp_path):
    """The engine hands PRIMESPEECH_CONVERTED_CACHE to its loaders and its model directory's folders (text data,
    NLTK downloads, G2PWModel) to the text front end (nothing below it reads them from the environment)."""
    from dora_primespeech_mlx.engine import GPTSoVITSEngine
    from dora_primespeech_mlx.text import g2pw

    settings = Settings.from_env({"PRIMESPEECH_CONVERTED_CACHE": "3", "PRIMESPEECH_G2PW": "true"})
    eng = GPTSoVITSEngine(model_dir=tmp_path, settings=settings)
    assert eng.store.keep_converted == 3
    assert eng.text_data.g2pw == g2pw.G2PWOptions(True, None, str(tmp_path / "G2PWModel"))
    assert eng.text_data.folder == tmp_path / "text-data"
    assert eng.text_data.nltk_folder == tmp_path / "nltk_data"
    assert eng.store.text_data is eng.text_data
    data = Path(tmp_path / "elsewhere")
    other = GPTSoVITSEngine(model_dir=tmp_path, settings=Settings.from_env({"PRIMESPEECH_TEXT_DATA": str(data)}))
    assert other.text_data.folder == data and other.text_data.g2pw.enabled is False
    assert eng.text_data.folder == tmp_path / "text-data"  # two engines, two front-end data values
