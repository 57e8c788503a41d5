"""A structure-aware fuzzer of the torch-free checkpoint reader (``convert.torch_pickle``).

Each case starts from a valid ``torch.save``-format zip archive (small ones built here by
:class:`CheckpointBuilder`, and the fixtures' GPT checkpoint when ``PRIMESPEECH_FIXTURES`` names one) and
mutates one layer of it:

- ``geometry``: a tensor's sizes, strides, storage offset, storage type, the storage's recorded size or key;
- ``opcode``: the pickle program (integer and string arguments, a global's name, opcodes deleted, duplicated,
  swapped or inserted, the program truncated);
- ``pid``: the persistent ids naming storages (their tag, type, key, size, length);
- ``zip``: the archive's headers (declared sizes, offsets, compression method, flags, CRC), members
  deflated or duplicated, the archive truncated or padded.

A case passes when :func:`load_torch_file` returns or raises :class:`CheckpointError` within the time and
memory bounds, and no payload ran (the dangerous globals a mutation names would create a marker file). Cases run
in worker subprocesses (batches) so a crash (a signal) is caught and reported with its case number; a worker
runs under an address-space limit so a memory bomb fails as ``MemoryError`` instead of taking the machine.

Longer runs: ``python tests/tools/fuzz_checkpoints.py --cases 100000 --seed 7 [--workers 2]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MAX_SECONDS_PER_CASE = 5.0  # the machine running the suite may be loaded; a normal case takes milliseconds
ADDRESS_SPACE_LIMIT = 3 << 30  # a worker's virtual memory (numpy + the reader need ~1 GB of address space)
MAX_RSS_MB = 400  # a worker's peak resident memory over a batch (the inputs are < 1 MB)
KINDS = ("geometry", "opcode", "pid", "zip")

# -----------------------------------------------------------------------------------------------------------
# Building valid checkpoints


@dataclass
class Tensor:
    name: str
    key: str  # storage key
    storage: str  # torch storage class name
    numel: int  # the storage's recorded size (elements)
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


_ITEMSIZE = {"HalfStorage": 2, "FloatStorage": 4, "DoubleStorage": 8, "BFloat16Storage": 2, "LongStorage": 8,
             "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1}


class PickleWriter:
    """A protocol-2 pickle program as ``torch.save`` writes it (globals by name, storages by persistent id)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")

    def op(self, code: bytes, arg: bytes = b"") -> PickleWriter:
        self.out += code + arg
        return self

    def value(self, v) -> PickleWriter:
        if v is None:
            return self.op(pickle.NONE)
        if v is True or v is False:
            return self.op(pickle.NEWTRUE if v else pickle.NEWFALSE)
        if isinstance(v, int):
            if -(1 << 31) <= v < (1 << 31):
                return self.op(pickle.BININT, struct.pack("<i", v))
            enc = pickle.encode_long(v)
            return self.op(pickle.LONG1, bytes([len(enc)]) + enc)
        if isinstance(v, float):
            return self.op(pickle.BINFLOAT, struct.pack(">d", v))
        if isinstance(v, str):
            b = v.encode("utf-8")
            return self.op(pickle.BINUNICODE, struct.pack("<I", len(b)) + b)
        if isinstance(v, tuple):
            self.op(pickle.MARK)
            for x in v:
                self.value(x)
            return self.op(pickle.TUPLE)
        if isinstance(v, list):
            self.op(pickle.EMPTY_LIST).op(pickle.MARK)
            for x in v:
                self.value(x)
            return self.op(pickle.APPENDS)
        if isinstance(v, dict):
            self.op(pickle.EMPTY_DICT).op(pickle.MARK)
            for k, x in v.items():
                self.value(k).value(x)
            return self.op(pickle.SETITEMS)
        if isinstance(v, Tensor):
            return self.tensor(v)
        raise TypeError(type(v))

    def glob(self, module: str, name: str) -> PickleWriter:
        return self.op(pickle.GLOBAL, f"{module}\n{name}\n".encode())

    def tensor(self, t: Tensor) -> PickleWriter:
        self.glob("torch._utils", "_rebuild_tensor_v2").op(pickle.MARK)
        self.op(pickle.MARK).value("storage").glob("torch", t.storage).value(t.key).value("cpu").value(t.numel)
        self.op(pickle.TUPLE).op(pickle.BINPERSID)
        self.value(t.offset).value(tuple(t.size)).value(tuple(t.stride)).value(False)
        self.glob("collections", "OrderedDict").op(pickle.EMPTY_TUPLE).op(pickle.REDUCE)
        return self.op(pickle.TUPLE).op(pickle.REDUCE)

    def ordered(self, items: dict) -> PickleWriter:
        self.glob("collections", "OrderedDict").op(pickle.EMPTY_TUPLE).op(pickle.REDUCE).op(pickle.MARK)
        for k, x in items.items():
            self.value(k).value(x)
        return self.op(pickle.SETITEMS)

    def hparams(self, state: dict) -> PickleWriter:
        self.glob("utils", "HParams").op(pickle.EMPTY_TUPLE).op(pickle.NEWOBJ)
        return self.value(state).op(pickle.BUILD)

    def finish(self) -> bytes:
        return bytes(self.out + pickle.STOP)


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= n
    return tuple(reversed(stride))


def storage_bytes(storage: str, numel: int, rng: random.Random) -> bytes:
    """Finite little values of the storage's type."""
    n = numel * _ITEMSIZE[storage]
    if storage in ("HalfStorage", "FloatStorage", "DoubleStorage"):
        dt = {"HalfStorage": "<f2", "FloatStorage": "<f4", "DoubleStorage": "<f8"}[storage]
        vals = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(numel).astype(dt)
        return vals.tobytes()
    if storage == "BFloat16Storage":
        f = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(numel).astype("<f4")
        return (f.view("<u4") >> 16).astype("<u2").tobytes()
    return bytes(rng.randrange(2) for _ in range(n))


def zip_archive(members: dict[str, bytes], deflate: frozenset[str] = frozenset()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name), data,
                       compress_type=zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
    return buf.getvalue()


@dataclass
class CheckpointBuilder:
    """A small GPT-like checkpoint: ``{"weight": OrderedDict(name -> tensor), "config": {...}, "info": ...}``."""

    tensors: list[Tensor] = field(default_factory=list)
    storages: dict[str, bytes] = field(default_factory=dict)
    config: dict = field(default_factory=lambda: {"model": {"n_layer": 1, "head": 2}, "data": {"max_sec": 1}})
    archive_name: str = "archive"
    hparams: bool = False

    @classmethod
    def random(cls, rng: random.Random) -> CheckpointBuilder:
        b = cls(hparams=rng.random() < 0.3)
        for i in range(rng.randint(1, 4)):
            storage = rng.choice(["HalfStorage", "FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage"])
            shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(0, 3)))
            numel = int(np.prod(shape)) if shape else 1
            extra = rng.choice([0, 0, 3])
            key = str(i)
            b.tensors.append(Tensor(f"layer.{i}.weight", key, storage, numel + extra, extra, shape, contiguous(shape)))
            b.storages[key] = storage_bytes(storage, numel + extra, rng)
        if len(b.tensors) > 1 and rng.random() < 0.3:  # a second view of a storage (tied weights)
            t = b.tensors[0]
            b.tensors.append(Tensor("tied.weight", t.key, t.storage, t.numel, t.offset, t.size, t.stride))
        return b

    def pickle(self) -> bytes:
        w = PickleWriter()
        w.op(pickle.EMPTY_DICT).op(pickle.MARK)
        w.value("weight").ordered({t.name: t for t in self.tensors})
        w.value("config")
        if self.hparams:
            w.hparams(self.config)
        else:
            w.value(self.config)
        w.value("info").value("fuzz")
        w.op(pickle.SETITEMS)
        return w.finish()

    def members(self, pkl: bytes | None = None) -> dict[str, bytes]:
        p = self.archive_name + "/"
        out = {p + "data.pkl": self.pickle() if pkl is None else pkl, p + "byteorder": b"little"}
        out.update({p + f"data/{k}": v for k, v in self.storages.items()})
        out[p + "version"] = b"3\n"
        return out

    def archive(self, pkl: bytes | None = None, deflate: frozenset[str] = frozenset()) -> bytes:
        return zip_archive(self.members(pkl), deflate)


# -----------------------------------------------------------------------------------------------------------
# Mutations

INTERESTING = (-(1 << 63), -(1 << 31), -65536, -2, -1, 0, 1, 2, 3, 7, 255, 256, 65535, 65536, 1 << 20,
               (1 << 31) - 1, 1 << 31, 1 << 32, 1 << 40, (1 << 62), (1 << 63) - 1, 1 << 63, 1 << 64, 10 ** 30)
DANGEROUS_GLOBALS = (("os", "system"), ("builtins", "eval"), ("builtins", "exec"), ("subprocess", "Popen"),
                     ("posix", "system"), ("builtins", "getattr"), ("builtins", "open"), ("io", "open"),
                     ("shutil", "rmtree"), ("builtins", "__import__"), ("copyreg", "_reconstructor"),
                     ("numpy", "frombuffer"), ("numpy.lib.stride_tricks", "as_strided"), ("builtins", "bytearray"),
                     ("torch", "Tensor"), ("builtins", "setattr"), ("builtins", "type"))
ALLOWED_GLOBALS = (("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
                   ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_parameter"), ("utils", "HParams"),
                   ("GPT_SoVITS.utils", "HParams"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
                   ("_codecs", "encode"), *(("torch", s) for s in _ITEMSIZE))
INSERTABLE = (pickle.BUILD, pickle.SETITEM, pickle.SETITEMS, pickle.REDUCE, pickle.MARK, pickle.TUPLE, pickle.DUP,
              pickle.POP, pickle.BINPERSID, pickle.NONE, pickle.EMPTY_DICT, pickle.EMPTY_LIST, pickle.APPEND,
              pickle.APPENDS, pickle.NEWOBJ, pickle.STOP, pickle.EMPTY_TUPLE, pickle.TUPLE1, pickle.TUPLE2,
              pickle.POP_MARK, pickle.NEWOBJ_EX, pickle.STACK_GLOBAL, pickle.EMPTY_SET, pickle.ADDITEMS,
              pickle.FROZENSET, pickle.MEMOIZE, pickle.FRAME + struct.pack("<Q", 1 << 40), pickle.BINGET + b"\x01",
              pickle.LONG_BINGET + struct.pack("<I", 1 << 31), pickle.BINBYTES8 + struct.pack("<Q", 1 << 62),
              pickle.LONG4 + struct.pack("<i", (1 << 31) - 1), pickle.BINUNICODE + struct.pack("<I", 0xFFFFFFFF),
              pickle.PROTO + b"\x09", pickle.EXT1 + b"\x01", pickle.INST + b"os\nsystem\n",
              pickle.PERSID + b"storage\n", pickle.NEXT_BUFFER, pickle.READONLY_BUFFER)


def _marker_command(marker: Path) -> str:
    return f"touch {marker}"


def mutate_geometry(b: CheckpointBuilder, rng: random.Random) -> None:
    t = rng.choice(b.tensors)
    what = rng.choice(["size", "stride", "offset", "storage", "numel", "key", "ndim", "broadcast", "tied"])
    if what == "size" and t.size:
        i = rng.randrange(len(t.size))
        t.size = t.size[:i] + (rng.choice(INTERESTING),) + t.size[i + 1:]
    elif what == "stride" and t.stride:
        i = rng.randrange(len(t.stride))
        t.stride = t.stride[:i] + (rng.choice(INTERESTING),) + t.stride[i + 1:]
    elif what == "offset":
        t.offset = rng.choice(INTERESTING + (t.numel, t.numel - 1, -t.numel))
    elif what == "storage":
        t.storage = rng.choice(list(_ITEMSIZE))
    elif what == "numel":
        t.numel = rng.choice(INTERESTING + (t.numel + 1, t.numel - 1))
    elif what == "key":
        t.key = rng.choice(["9", "", "../data.pkl", "0", "1", "x" * 200, "data.pkl"])
    elif what == "ndim":
        n = rng.choice([0, 1, 33, 64, 100])
        t.size, t.stride = (1,) * n, (1,) * n
    elif what == "broadcast":  # a stride-0 view of a long axis
        t.size, t.stride = (rng.choice([2, 1000, 1 << 20, 1 << 30]),) + t.size, (0,) + t.stride
    else:  # a second tensor over the same storage with other geometry
        b.tensors.append(Tensor("other", t.key, rng.choice(list(_ITEMSIZE)), t.numel, 0, (t.numel + 1,), (1,)))


def _ops(data: bytes) -> list[tuple[bytes, object, int, int]]:
    """(opcode byte, arg, start, end) of each op of a valid pickle."""
    import pickletools

    ops = list(pickletools.genops(data))
    out = []
    for i, (op, arg, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(data)
        out.append((op.code.encode("latin1"), arg, pos, end))
    return out


def _int_op(v: int) -> bytes:
    return PickleWriter().value(v).out[2:]


def _str_op(s: str) -> bytes:
    return PickleWriter().value(s).out[2:]


def mutate_opcodes(pkl: bytes, rng: random.Random, marker: Path) -> bytes:
    ops = _ops(pkl)
    chunks = [pkl[s:e] for _, _, s, e in ops]
    n_mut = rng.choice([1, 1, 1, 2, 3, 8])
    for _ in range(n_mut):
        i = rng.randrange(len(chunks))
        code, arg = (ops[i][0], ops[i][1]) if i < len(ops) else (b"", None)
        r = rng.random()
        if isinstance(arg, int) and not isinstance(arg, bool) and r < 0.5:
            chunks[i] = _int_op(rng.choice(INTERESTING + (arg + 1, arg - 1, -arg, arg * 1000)))
        elif isinstance(arg, str) and code in (pickle.GLOBAL,) and r < 0.6:
            mod, name = rng.choice(DANGEROUS_GLOBALS if rng.random() < 0.5 else ALLOWED_GLOBALS)
            chunks[i] = pickle.GLOBAL + f"{mod}\n{name}\n".encode()
        elif isinstance(arg, str) and r < 0.5:
            chunks[i] = _str_op(rng.choice(["", "storage", "0", "1", "weight", "__class__", "__setstate__", "dtype",
                                            "big", ">", "x" * 1000, _marker_command(marker), "\udcff" * 0 + "é"]))
        elif r < 0.6:
            del chunks[i]
        elif r < 0.7:
            chunks.insert(i, chunks[i])
        elif r < 0.8 and i + 1 < len(chunks):
            chunks[i], chunks[i + 1] = chunks[i + 1], chunks[i]
        elif r < 0.95:
            chunks.insert(i, rng.choice(INSERTABLE))
        else:
            return b"".join(chunks)[: rng.randrange(max(1, len(pkl)))]
        if not chunks:
            break
    return b"".join(chunks)


def mutate_pids(b: CheckpointBuilder, rng: random.Random, marker: Path) -> bytes:
    """The pickle with one persistent id rewritten (tag, type, key, size, length)."""
    t = rng.choice(b.tensors)
    w = PickleWriter()
    w.op(pickle.EMPTY_DICT).op(pickle.MARK).value("weight")
    w.glob("collections", "OrderedDict").op(pickle.EMPTY_TUPLE).op(pickle.REDUCE).op(pickle.MARK)
    for x in b.tensors:
        w.value(x.name)
        if x is not t:
            w.tensor(x)
            continue
        w.glob("torch._utils", "_rebuild_tensor_v2").op(pickle.MARK)
        pid: list = ["storage", ("torch", x.storage), x.key, "cpu", x.numel]
        what = rng.randrange(7)
        if what == 0:
            pid[0] = rng.choice(["Storage", "", "module", 0])
        elif what == 1:
            pid[1] = rng.choice([("torch", "Tensor"), ("os", "system"), ("numpy", "dtype"), None, "HalfStorage"])
        elif what == 2:
            pid[2] = rng.choice([0, -1, None, ("a",), "../../etc/passwd", "0" * 100, 1 << 70])
        elif what == 3:
            pid[4] = rng.choice(INTERESTING + (None, "10", 1.5))
        elif what == 4:
            pid = pid[: rng.randrange(5)]
        elif what == 5:
            pid = ("storage", "x", _marker_command(marker))
        else:
            pid = pid + [rng.choice(INTERESTING)]
        if isinstance(pid, list):
            w.op(pickle.MARK)
            for j, v in enumerate(pid):
                if j == 1 and isinstance(v, tuple):
                    w.glob(*v)
                else:
                    w.value(v)
            w.op(pickle.TUPLE)
        else:
            w.value(pid)
        w.op(pickle.BINPERSID)
        w.value(x.offset).value(tuple(x.size)).value(tuple(x.stride)).value(False)
        w.glob("collections", "OrderedDict").op(pickle.EMPTY_TUPLE).op(pickle.REDUCE)
        w.op(pickle.TUPLE).op(pickle.REDUCE)
    w.op(pickle.SETITEMS).value("config").value(b.config).op(pickle.SETITEMS)
    return w.finish()


def _records(data: bytes, sig: bytes) -> list[int]:
    out, i = [], data.find(sig)
    while i >= 0:
        out.append(i)
        i = data.find(sig, i + 1)
    return out


def mutate_zip(archive: bytes, b: CheckpointBuilder | None, rng: random.Random) -> bytes:
    """Archive-level damage: declared sizes, offsets, method, flags, CRC; deflate bombs; truncation."""
    what = rng.randrange(9)
    data = bytearray(archive)
    central = _records(archive, b"PK\x01\x02")
    local = _records(archive, b"PK\x03\x04")
    if what == 0 and central:  # central directory: uncompressed / compressed size, local header offset
        at = rng.choice(central)
        field_off = rng.choice([20, 24, 42])
        struct.pack_into("<I", data, at + field_off, rng.choice([0, 1, 0xFFFFFFFF, 1 << 31, 12345678,
                                                                struct.unpack_from("<I", data, at + field_off)[0] + 1]))
    elif what == 1 and central:  # compression method / flags / CRC
        at = rng.choice(central)
        off, fmt = rng.choice([(10, "<H"), (8, "<H"), (16, "<I")])
        struct.pack_into(fmt, data, at + off, rng.choice([0, 1, 8, 9, 12, 14, 99, 0xFFFF]))
    elif what == 2 and local:  # local header sizes / name length
        at = rng.choice(local)
        off, fmt = rng.choice([(18, "<I"), (22, "<I"), (26, "<H"), (28, "<H")])
        struct.pack_into(fmt, data, at + off, rng.choice([0, 1, 0xFFFF, 4096]))
    elif what == 3:  # truncation
        return bytes(data[: rng.randrange(len(data))])
    elif what == 4:  # junk appended / prepended
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        return bytes(data + junk) if rng.random() < 0.5 else bytes(junk + data)
    elif what == 5 and b is not None:  # a deflated storage declaring more than it holds (a small zip bomb)
        key = rng.choice(list(b.storages))
        big = rng.choice([1 << 20, 32 << 20, 256 << 20])
        for t in b.tensors:
            if t.key == key:
                t.numel = big // _ITEMSIZE[t.storage]
        return _bomb(b, key, big)
    elif what == 6 and b is not None:  # duplicate member names / deflated data.pkl
        members = b.members()
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, blob in members.items():
                z.writestr(name, blob, compress_type=zipfile.ZIP_DEFLATED)
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                name = rng.choice(list(members))
                z.writestr(name, bytes(rng.randrange(256) for _ in range(rng.randint(0, 32))))
        return buf.getvalue()
    elif what == 7:  # random byte flips
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
    else:  # the version tag of GPT-SoVITS files over "PK"
        data[:2] = rng.choice([b"00", b"01", b"05", b"07", b"\x80\x02", b"PK"])
    return bytes(data)


_ZERO_STREAMS: dict[int, tuple[bytes, int]] = {}


def _zero_stream(size: int) -> tuple[bytes, int]:
    """(raw deflate stream, CRC) of ``size`` zero bytes, made once per process."""
    if size not in _ZERO_STREAMS:
        comp = zlib.compressobj(1, zlib.DEFLATED, -15)
        zero = bytes(1 << 20)
        parts, crc = [], 0
        for _ in range(size >> 20):
            parts.append(comp.compress(zero))
            crc = zlib.crc32(zero, crc)
        parts.append(comp.flush())
        _ZERO_STREAMS[size] = (b"".join(parts), crc)
    return _ZERO_STREAMS[size]


def _bomb(b: CheckpointBuilder, key: str, big: int) -> bytes:
    """An archive whose storage ``key`` inflates to ``big`` zero bytes (a deflate stream ~1000 times smaller)."""
    stream, crc = _zero_stream(big)
    members = b.members()
    name = f"{b.archive_name}/data/{key}"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, blob in members.items():
            if n != name:
                z.writestr(n, blob)
    entries = buf.getvalue()
    # Append the bomb member by hand (zipfile cannot write a pre-compressed stream).
    raw = bytearray(entries[: entries.find(b"PK\x01\x02")])
    cd = bytearray(entries[entries.find(b"PK\x01\x02"): entries.find(b"PK\x05\x06")])
    offset = len(raw)
    nb = name.encode()
    raw += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(stream), big, len(nb), 0) + nb + stream
    cd += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, crc, len(stream), big, len(nb),
                      0, 0, 0, 0, 0, offset) + nb
    count = len(_records(bytes(cd), b"PK\x01\x02"))
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(cd), len(raw), 0)
    return bytes(raw + cd + end)


# -----------------------------------------------------------------------------------------------------------
# Cases


def fixture_bases() -> list[bytes]:
    """The fixtures' GPT checkpoint (when the fixtures are present): a real torch.save archive."""
    root = os.environ.get("PRIMESPEECH_FIXTURES")
    if not root:
        return []
    try:
        cases = json.loads((Path(root) / "models" / "cases.json").read_text())
        return [(Path(root) / "models" / cases["checkpoints"]["gpt"]).read_bytes()]
    except (OSError, KeyError, ValueError):
        return []


def make_case(seed: int, index: int, bases: list[bytes], marker: Path) -> tuple[str, bytes]:
    """(kind, file bytes) of case ``index`` of run ``seed``: deterministic."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = KINDS[index % len(KINDS)]
    if bases and rng.random() < 0.15 and kind in ("opcode", "zip"):
        base = rng.choice(bases)
        if kind == "zip":
            return kind, mutate_zip(base, None, rng)
        with zipfile.ZipFile(io.BytesIO(base)) as z:
            members = {i.filename: z.read(i) for i in z.infolist()}
        pkl_name = next(n for n in members if n.endswith("data.pkl"))
        members[pkl_name] = mutate_opcodes(members[pkl_name], rng, marker)
        return kind, zip_archive(members)
    b = CheckpointBuilder.random(rng)
    if kind == "geometry":
        for _ in range(rng.choice([1, 1, 2, 3])):
            mutate_geometry(b, rng)
        return kind, b.archive()
    if kind == "opcode":
        return kind, b.archive(mutate_opcodes(b.pickle(), rng, marker))
    if kind == "pid":
        return kind, b.archive(mutate_pids(b, rng, marker))
    return kind, mutate_zip(b.archive(), b, rng)


def run_cases(seed: int, start: int, count: int, workdir: Path) -> Iterator[dict]:
    """Run cases ``start .. start+count`` in this process, yielding one result dict per case as it ends."""
    sys.path.insert(0, str(REPO))
    from dora_primespeech_mlx.convert.torch_pickle import CheckpointError, load_torch_file

    marker = workdir / "PAYLOAD-RAN"
    bases = fixture_bases()
    crash_at = int(os.environ.get("FUZZ_SELF_TEST_CRASH_AT", "-1"))  # the harness's own test: a signal mid-batch
    for index in range(start, start + count):
        if index == crash_at:
            os.kill(os.getpid(), signal.SIGSEGV)
        kind, data = make_case(seed, index, bases, marker)
        path = workdir / f"case-{index}.ckpt"
        path.write_bytes(data)
        t0 = time.perf_counter()
        try:
            load_torch_file(path)
            outcome, detail = "loaded", ""
        except CheckpointError as exc:
            outcome, detail = "refused", str(exc)[len(str(path)) + 2:][:160]
        except BaseException as exc:  # noqa: BLE001 - any other exception is a finding
            outcome, detail = "error", f"{type(exc).__name__}: {exc}"[:300]
        seconds = time.perf_counter() - t0
        path.unlink()
        if marker.exists():
            outcome, detail = "payload", "a dangerous global ran"
        if seconds > MAX_SECONDS_PER_CASE:
            outcome, detail = "slow", f"{seconds:.1f} s; {outcome}: {detail}"
        yield {"index": index, "kind": kind, "outcome": outcome, "detail": detail, "seconds": round(seconds, 4),
               "bytes": len(data)}


def _worker_limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


@dataclass
class Report:
    cases: int = 0
    outcomes: dict = field(default_factory=dict)
    by_kind: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)  # crashes, payloads, unexpected exceptions, slow cases
    max_seconds: float = 0.0
    max_rss_mb: float = 0.0
    seconds: float = 0.0

    def add(self, r: dict) -> None:
        self.cases += 1
        self.outcomes[r["outcome"]] = self.outcomes.get(r["outcome"], 0) + 1
        k = self.by_kind.setdefault(r["kind"], {})
        k[r["outcome"]] = k.get(r["outcome"], 0) + 1
        self.max_seconds = max(self.max_seconds, r["seconds"])
        if r["outcome"] not in ("loaded", "refused"):
            self.failures.append(r)

    def summary(self) -> str:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_kind.items()))
        return (f"{self.cases} cases in {self.seconds:.1f} s: {self.outcomes}; by kind {kinds}; slowest case "
                f"{self.max_seconds * 1000:.0f} ms; worker peak RSS {self.max_rss_mb:.0f} MB; "
                f"{len(self.failures)} failures")


def _batch(seed: int, start: int, count: int, results: Path) -> subprocess.Popen:
    """A worker running ``count`` cases from ``start``, one JSON line per case into ``results`` (flushed, so a
    crash leaves the cases before it)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", "--seed", str(seed), "--start", str(start), "--cases", str(count),
         "--results", str(results)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, preexec_fn=_worker_limits)


def fuzz(cases: int, seed: int, batch: int = 500, workers: int = 1, timeout: float = 600.0) -> Report:
    """Run ``cases`` cases in worker subprocesses of ``batch`` cases each, ``workers`` at a time."""
    report = Report()
    t0 = time.perf_counter()
    pending = [(s, min(batch, cases - s)) for s in range(0, cases, batch)]
    running: list[tuple[subprocess.Popen, int, int, Path]] = []
    tmp = tempfile.TemporaryDirectory(prefix="fuzz-results-")
    try:
        while pending or running:
            while pending and len(running) < workers:
                s, n = pending.pop(0)
                out_file = Path(tmp.name) / f"batch-{s}.jsonl"
                running.append((_batch(seed, s, n, out_file), s, n, out_file))
            proc, s, n, out_file = running.pop(0)
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                report.failures.append({"index": s, "kind": "batch", "outcome": "hang",
                                        "detail": f"batch {s}..{s + n} ran past {timeout} s"})
                continue
            lines = out_file.read_text().splitlines() if out_file.exists() else []
            done = [json.loads(line) for line in lines if line.startswith("{")]
            for r in done:
                if "rss_mb" in r:
                    report.max_rss_mb = max(report.max_rss_mb, r["rss_mb"])
                else:
                    report.add(r)
            if proc.returncode != 0:
                crashed = s + sum(1 for r in done if "index" in r)
                report.failures.append({"index": crashed, "kind": "batch", "outcome": "crash",
                                        "detail": f"worker exit {proc.returncode}: {err.decode()[-400:]}"})
    finally:
        for proc, *_ in running:
            proc.kill()
            proc.communicate()
        tmp.cleanup()
    report.seconds = time.perf_counter() - t0
    if report.max_rss_mb > MAX_RSS_MB:
        report.failures.append({"index": -1, "kind": "batch", "outcome": "memory",
                                "detail": f"a worker peaked at {report.max_rss_mb:.0f} MB RSS"})
    return report


def _worker(seed: int, start: int, count: int, results: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-ckpt-") as tmp, open(results, "w") as out:
        for r in run_cases(seed, start, count, Path(tmp)):
            out.write(json.dumps(r) + "\n")
            out.flush()
        out.write(json.dumps({"rss_mb": peak_rss_mb()}) + "\n")


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: since its exec, unlike ru_maxrss, which a child inherits)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--results", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        _worker(a.seed, a.start, a.cases, a.results)
        return 0
    report = fuzz(a.cases, a.seed, a.batch, a.workers)
    print(report.summary())
    for f in report.failures[:20]:
        print("FAIL", json.dumps(f))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
