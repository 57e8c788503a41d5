"""Hostile checkpoint files: bad tensor geometry, state shared between loads, zip bombs.

Each file is built with the fuzzer's writer (``tests/tools/fuzz_checkpoints.py``): a valid ``torch.save``
archive with one thing made hostile. The ones that crashed or exhausted the process before the reader checked
them run in a subprocess (under an address-space limit), so a regression fails the test instead of the session.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from dora_primespeech_mlx.convert.checkpoints import read_gpt
from dora_primespeech_mlx.convert.torch_pickle import CheckpointError, load_torch_file
from tests.conftest import load_cases_json, require_fixture
from tests.tools.fuzz_checkpoints import CheckpointBuilder, PickleWriter, Tensor, contiguous, storage_bytes, zip_archive

REPO = Path(__file__).resolve().parents[2]
LIMIT_AS = 1536 << 20  # the subprocesses' address space: a 2 GB expansion fails as MemoryError, not by the OOM killer


def _builder(shape=(4, 3), storage="HalfStorage", extra=0) -> CheckpointBuilder:
    numel = int(np.prod(shape)) + extra
    b = CheckpointBuilder()
    b.tensors.append(Tensor("w", "0", storage, numel, 0, shape, contiguous(shape)))
    b.storages["0"] = storage_bytes(storage, numel, random.Random(0))
    return b


def _write(tmp_path: Path, data: bytes, name="hostile.ckpt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _load_in_subprocess(path: Path, limit: int = LIMIT_AS) -> tuple[subprocess.CompletedProcess, dict]:
    """Load ``path`` in a fresh interpreter: (the process, {"outcome", "message", "seconds", "rss_mb"})."""
    code = textwrap.dedent(f"""
        import json, resource, sys, time
        resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
        from dora_primespeech_mlx.convert.torch_pickle import CheckpointError, load_torch_file
        t0 = time.perf_counter()
        try:
            load_torch_file(sys.argv[1])
            out = {{"outcome": "loaded", "message": ""}}
        except CheckpointError as exc:
            out = {{"outcome": "refused", "message": str(exc)}}
        except BaseException as exc:
            out = {{"outcome": type(exc).__name__, "message": str(exc)}}
        out["seconds"] = time.perf_counter() - t0
        status = open("/proc/self/status").read()
        out["rss_mb"] = int(status.split("VmHWM:")[1].split()[0]) / 1024  # this process's peak (not the parent's)
        print(json.dumps(out))
    """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc, (json.loads(lines[-1]) if lines else {})


# -- geometry ------------------------------------------------------------------------------------------------


def test_negative_stride_is_refused_in_a_subprocess_without_a_signal(tmp_path):
    """A ~600-byte file with a negative stride reached ``as_strided``: SIGSEGV."""
    b = _builder((2, 3))
    b.tensors[0].stride = (-(1 << 40), 1)
    path = _write(tmp_path, b.archive())
    assert path.stat().st_size < 1024
    proc, out = _load_in_subprocess(path)
    assert proc.returncode == 0, f"the reader died (exit {proc.returncode}): {proc.stderr[-500:]}"
    assert out["outcome"] == "refused" and "negative" in out["message"], out
    assert str(path) in out["message"]


@pytest.mark.parametrize("offset", [-1, -12])
def test_negative_offset_is_refused(tmp_path, offset):
    """A negative storage offset read elements before the storage (heap bytes returned as weights)."""
    b = _builder((4,))
    b.tensors[0].offset = offset
    with pytest.raises(CheckpointError, match="negative storage offset"):
        load_torch_file(_write(tmp_path, b.archive()))


@pytest.mark.parametrize("offset,shape,stride", [(0, (13,), (1,)), (10, (4,), (1,)), (0, (3, 5), (5, 1)),
                                                 (12, (), ()), (0, (2, 2), (12, 1))])
def test_tensor_past_the_end_of_its_storage_is_refused(tmp_path, offset, shape, stride):
    b = _builder((12,))
    t = b.tensors[0]
    t.offset, t.size, t.stride = offset, shape, stride
    with pytest.raises(CheckpointError, match="overruns its storage"):
        load_torch_file(_write(tmp_path, b.archive()))


def test_stride0_expansion_is_refused_within_a_bound(tmp_path):
    """A ~600-byte file whose one-element storage is viewed with stride 0 as 2**30 float16 values (2 GB)."""
    b = _builder((1,))
    b.tensors[0].size, b.tensors[0].stride = (1 << 30,), (0,)
    path = _write(tmp_path, b.archive())
    assert path.stat().st_size < 1024
    proc, out = _load_in_subprocess(path)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert out["outcome"] == "refused" and "expand its storage" in out["message"], out
    assert out["seconds"] < 1.0 and out["rss_mb"] < 300, out


def test_overlapping_views_are_bounded_per_load(tmp_path):
    """Each view may expand its storage a little (a broadcast bias), but not again and again."""
    b = _builder((1024,))
    b.tensors[0].size, b.tensors[0].stride = (8, 1024), (0, 1)  # 8 overlapping rows: 8x the storage
    with pytest.raises(CheckpointError, match="expand its storage"):
        load_torch_file(_write(tmp_path, b.archive()))
    small = _builder((4,))
    small.tensors[0].size, small.tensors[0].stride = (3, 4), (0, 1)  # within the allowance: loads
    out = load_torch_file(_write(tmp_path, small.archive(), "small.ckpt"))["weight"]["w"]
    assert out.shape == (3, 4) and (out == out[0]).all()


def test_many_rebuilds_of_one_storage_hit_the_load_budget(tmp_path):
    """Thousands of tensors rebuilt from one storage: the load's materialised bytes are bounded."""
    shape = (1 << 18,)  # 512 KB of float16
    b = _builder(shape)
    t = b.tensors[0]
    b.tensors += [Tensor(f"copy{i}", "0", t.storage, t.numel, 0, shape, (1,)) for i in range(200)]
    with pytest.raises(CheckpointError, match="twice their storages"):
        load_torch_file(_write(tmp_path, b.archive()))


def test_valid_views_load_exactly(tmp_path):
    """Offsets, transposed strides and shared storages still load to the values torch would give."""
    b = _builder((4, 3), storage="FloatStorage", extra=6)
    t = b.tensors[0]
    t.offset = 6
    b.tensors.append(Tensor("wt", "0", t.storage, t.numel, 6, (3, 4), (1, 3)))
    b.tensors.append(Tensor("scalar", "0", t.storage, t.numel, 17, (), ()))
    b.tensors.append(Tensor("empty", "0", t.storage, t.numel, 18, (0, 5), (5, 1)))
    out = load_torch_file(_write(tmp_path, b.archive()))["weight"]
    flat = np.frombuffer(b.storages["0"], "<f4")
    np.testing.assert_array_equal(out["w"], flat[6:].reshape(4, 3))
    np.testing.assert_array_equal(out["wt"], flat[6:].reshape(4, 3).T)
    assert out["scalar"].shape == () and out["scalar"] == flat[17]
    assert out["empty"].shape == (0, 5)


# -- no state shared between loads ----------------------------------------------------------------------------


def _build_on(target: PickleWriter, state) -> bytes:
    """A checkpoint whose pickle first BUILDs ``state`` onto the object ``target`` pushed, then is a valid file."""
    target.value(state).op(pickle.BUILD).op(pickle.POP)
    b = _builder((2,))
    good = b.pickle()
    return b.archive(bytes(target.out) + good[2:])


def _hostile_builds() -> dict[str, bytes]:
    return {
        "storage type dtype": _build_on(PickleWriter().glob("torch", "HalfStorage"), {"dtype": ">f2"}),
        "storage type slot": _build_on(PickleWriter().glob("torch", "HalfStorage"), (None, {"dtype": ">f2"})),
        "numpy dtype byte order": _build_on(
            PickleWriter().glob("numpy", "dtype").value(("f2", False, True)).op(pickle.REDUCE),
            (3, ">", None, None, None, -1, -1, 0)),
        "HParams class": _build_on(PickleWriter().glob("utils", "HParams"), (None, {"__getattr__": "x"})),
        "OrderedDict class": _build_on(PickleWriter().glob("collections", "OrderedDict"), (None, {"x": 1})),
        "codecs defaults": _build_on(PickleWriter().glob("_codecs", "encode"), (None, {"__defaults__": ("utf-16",)})),
        "rebuild function": _build_on(PickleWriter().glob("torch._utils", "_rebuild_tensor_v2"),
                                      (None, {"__defaults__": (0, (1,), (1,))})),
    }


def _weights_digest(weights: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode() + str(weights[k].dtype).encode() + str(weights[k].shape).encode())
        h.update(np.ascontiguousarray(weights[k]).tobytes())
    return h.hexdigest()


def test_a_hostile_build_is_refused_and_the_next_load_is_unchanged(tmp_path):
    """A BUILD on a handed-out class, storage type, dtype or function is refused, and a good GPT checkpoint
    loads bit-identically afterwards (in a fresh interpreter: the old reader's damage was process-wide)."""
    gpt = require_fixture(f"models/{load_cases_json()['checkpoints']['gpt']}")
    expected = _weights_digest(read_gpt(gpt).weights)
    files = []
    for i, (name, data) in enumerate(_hostile_builds().items()):
        files.append((name, str(_write(tmp_path, data, f"evil{i}.ckpt"))))
    code = textwrap.dedent("""
        import hashlib, json, sys
        import numpy as np
        from dora_primespeech_mlx.convert.checkpoints import read_gpt
        from dora_primespeech_mlx.convert.torch_pickle import CheckpointError, load_torch_file
        from tests.convert.test_hostile_checkpoints import _weights_digest
        files, gpt = json.loads(sys.argv[1]), sys.argv[2]
        out = {}
        for name, path in files:
            try:
                load_torch_file(path)
                out[name] = "loaded"
            except CheckpointError as exc:
                out[name] = "refused: " + str(exc)
        out["digest"] = _weights_digest(read_gpt(gpt).weights)
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(files), str(gpt)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-800:]
    out = json.loads(proc.stdout.splitlines()[-1])
    for name, _ in files:
        assert out[name].startswith("refused: ") and "refusing" in out[name], (name, out[name])
    assert out["digest"] == expected


def test_loads_share_no_objects(tmp_path):
    """Two loads of one file hand out no common mutable object (their config dicts, HParams, arrays)."""
    b = _builder((3,))
    b.hparams = True
    path = _write(tmp_path, b.archive())
    one, two = load_torch_file(path), load_torch_file(path)
    assert one["config"] is not two["config"] and type(one["config"]) is not type(two["config"])
    assert one["config"] == two["config"] and one["config"].model == {"n_layer": 1, "head": 2}
    assert one["weight"]["w"] is not two["weight"]["w"]


@pytest.mark.parametrize("op", ["setitem", "append", "newobj"])
def test_mutating_opcodes_only_touch_plain_containers(tmp_path, op):
    w = PickleWriter().glob("torch", "HalfStorage")
    if op == "setitem":
        w.value("dtype").value(">f2").op(pickle.SETITEM)
    elif op == "append":
        w.value(1).op(pickle.APPEND)
    else:
        w.op(pickle.EMPTY_TUPLE).op(pickle.NEWOBJ)
    b = _builder((2,))
    path = _write(tmp_path, b.archive(bytes(w.out) + b"0" + b.pickle()[2:]))
    with pytest.raises(CheckpointError, match="refusing"):
        load_torch_file(path)


def test_numpy_scalars_and_hparams_still_load(tmp_path):
    """The objects real files build with BUILD: a numpy scalar's dtype, HParams, a state dict's _metadata."""
    w = PickleWriter()
    w.op(pickle.EMPTY_DICT).op(pickle.MARK).value("weight").ordered({"w": _builder((2,)).tensors[0]})
    w.value({"_metadata": {"": {"version": 1}}}).op(pickle.BUILD)
    w.value("lr").glob("numpy.core.multiarray", "scalar").glob("numpy", "dtype").value(("f8", False, True))
    w.op(pickle.REDUCE).value((3, "<", None, None, None, -1, -1, 0)).op(pickle.BUILD)
    w.glob("_codecs", "encode").value((struct.pack("<d", 0.25).decode("latin1"), "latin1")).op(pickle.REDUCE)
    w.op(pickle.TUPLE2).op(pickle.REDUCE)
    w.value("config").hparams({"model": {"n_layer": 2}})
    w.op(pickle.SETITEMS)
    b = _builder((2,))
    obj = load_torch_file(_write(tmp_path, b.archive(w.finish())))
    assert obj["lr"] == 0.25 and obj["lr"].dtype == np.float64
    assert obj["weight"]._metadata == {"": {"version": 1}}
    assert obj["config"].model == {"n_layer": 2}
    on_dict = PickleWriter().value({}).value({"x": 1}).op(pickle.BUILD).finish()  # BUILD on a plain dict
    with pytest.raises(CheckpointError, match="refusing BUILD on a dict"):
        load_torch_file(_write(tmp_path, b.archive(on_dict), "bad.ckpt"))


@pytest.mark.parametrize("shape", ["cycle", "deep"])
def test_cyclic_or_deep_containers_are_refused(tmp_path, shape):
    w = PickleWriter().op(pickle.EMPTY_DICT).op(pickle.MARK).value("weight").ordered({"w": _builder((2,)).tensors[0]})
    w.value("config")
    if shape == "cycle":
        w.op(pickle.EMPTY_LIST).op(pickle.BINPUT, b"\x07")
        w.op(pickle.BINGET, b"\x07").op(pickle.APPEND)
    else:
        for _ in range(200):
            w.op(pickle.EMPTY_LIST)
        for _ in range(199):
            w.op(pickle.APPEND)
    w.op(pickle.SETITEMS)
    with pytest.raises(CheckpointError, match="contains itself|nests containers"):
        load_torch_file(_write(tmp_path, _builder((2,)).archive(w.finish())))


# -- zip caps --------------------------------------------------------------------------------------------------


def _zero_deflate(size: int) -> bytes:
    """A raw deflate stream of ``size`` zero bytes (~1000:1): one full-flush block of 1 MiB repeated."""
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = block.compress(bytes(1 << 20)) + block.flush(zlib.Z_FULL_FLUSH)
    return block * (size >> 20) + zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)


def _with_member(members: dict[str, bytes], name: str, stream: bytes, size: int, crc: int = 0) -> bytes:
    """A zip archive of ``members`` plus ``name`` given as a raw deflate ``stream`` declaring ``size`` bytes."""
    raw, cd, n = bytearray(), bytearray(), 0
    for member, data in [*members.items(), (name, None)]:
        nb = member.encode()
        if data is None:
            method, body, usize, c = 8, stream, size, crc
        else:
            method, body, usize, c = 0, data, len(data), zlib.crc32(data)
        cd += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, method, 0, 0, c, len(body), usize,
                          len(nb), 0, 0, 0, 0, 0, len(raw)) + nb
        raw += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, c, len(body), usize, len(nb), 0)
        raw += nb + body
        n += 1
    return bytes(raw + cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, len(cd), len(raw), 0))


def test_two_megabyte_zip_declaring_two_gigabytes_is_refused_fast(tmp_path):
    """A 2 MB archive whose one storage (a valid 2**30-element float16 tensor) inflates to 2 GB: refused from
    the declared sizes before anything is inflated (< 1 s, small RSS)."""
    size = 2 << 30
    b = _builder((1,))
    b.tensors[0].numel, b.tensors[0].size = 1 << 30, (1 << 30,)
    b.storages.pop("0")
    members = b.members()
    data = _with_member(members, "archive/data/0", _zero_deflate(size), size)
    path = _write(tmp_path, data)
    assert path.stat().st_size < 3 << 20
    proc, out = _load_in_subprocess(path)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert out["outcome"] == "refused" and "zip bomb" in out["message"], out
    assert out["seconds"] < 1.0 and out["rss_mb"] < 300, out


def test_member_sizes_must_match_what_the_tensors_record(tmp_path):
    b = _builder((4,))
    b.storages["0"] += bytes(64)  # 64 bytes more than the storage records
    with pytest.raises(CheckpointError, match="declares 72 bytes, its tensors record 8"):
        load_torch_file(_write(tmp_path, b.archive()))
    b = _builder((4,))
    b.storages["0"] = b.storages["0"][:6]
    with pytest.raises(CheckpointError, match="truncated"):
        load_torch_file(_write(tmp_path, b.archive(), "short.ckpt"))


def test_deflated_member_shorter_than_declared_is_refused(tmp_path):
    b = _builder((1024,))
    real = b.storages.pop("0")
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = comp.compress(real[:1000]) + comp.flush()  # holds 1000 bytes, declares 2048
    path = _write(tmp_path, _with_member(b.members(), "archive/data/0", stream, len(real), zlib.crc32(real)))
    with pytest.raises(CheckpointError):
        load_torch_file(path)


def test_stored_member_declaring_two_sizes_is_refused(tmp_path):
    data = bytearray(_builder((4,)).archive())
    name = b"archive/data/0"
    at = next(i for i in range(len(data)) if data[i:i + 4] == b"PK\x01\x02" and data[i + 46:i + 46 + len(name)] == name)
    struct.pack_into("<I", data, at + 24, 1 << 30)  # uncompressed size 1 GB, compressed 8 bytes
    with pytest.raises(CheckpointError, match="declares two different sizes"):
        load_torch_file(_write(tmp_path, bytes(data)))


def test_oversized_pickle_is_refused(tmp_path, monkeypatch):
    from dora_primespeech_mlx.convert import torch_pickle

    monkeypatch.setattr(torch_pickle, "MAX_PICKLE_BYTES", 100)
    with pytest.raises(CheckpointError, match="data.pkl declares"):
        load_torch_file(_write(tmp_path, _builder((2,)).archive()))


@pytest.mark.parametrize("body", [b"(" * 100_000, b"N0" * 10])
def test_pickle_programs_are_bounded(tmp_path, body):
    """100k nested MARKs (one list each: ~6 MB per 100 KB of pickle) are refused; a plain program still runs."""
    pkl = b"\x80\x02" + body + _builder((2,)).pickle()[2:]
    archive = _builder((2,)).archive(pkl)
    if body.startswith(b"("):
        with pytest.raises(CheckpointError, match="nested MARKs"):
            load_torch_file(_write(tmp_path, archive))
    else:
        assert "weight" in load_torch_file(_write(tmp_path, archive))


def test_version_tagged_file_is_read_without_a_copy(tmp_path):
    """A GPT-SoVITS version tag over "PK": read through a patched view of the file (same tensors)."""
    b = _builder((3, 2))
    plain = _write(tmp_path, b.archive())
    tagged = bytearray(plain.read_bytes())
    tagged[:2] = b"01"
    tagged_path = _write(tmp_path, bytes(tagged), "tagged.pth")
    np.testing.assert_array_equal(load_torch_file(plain)["weight"]["w"], load_torch_file(tagged_path)["weight"]["w"])


def test_no_file_contents_in_messages(tmp_path):
    path = _write(tmp_path, b"root:x:0:0:secret\n")
    with pytest.raises(CheckpointError) as exc:
        load_torch_file(path)
    assert "ro" not in str(exc.value).replace(str(path), "")


def test_many_unused_members_are_not_read(tmp_path):
    """Members no tensor names cost nothing: a 100 MB unused member (declared, stored) is never read."""
    members = {f"archive/x{i}": b"" for i in range(2000)}
    members.update(_builder((2,)).members())
    obj = load_torch_file(_write(tmp_path, zip_archive(members)))
    assert "weight" in obj
    with zipfile.ZipFile(tmp_path / "hostile.ckpt") as z:
        assert len(z.infolist()) == 2004
