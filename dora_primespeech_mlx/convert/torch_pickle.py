"""Read PyTorch ``torch.save`` zip archives without PyTorch.

A ``torch.save`` file is a zip archive holding ``<name>/data.pkl`` (a pickle) and one file per tensor
storage under ``<name>/data/<key>``. The pickle rebuilds tensors through
``torch._utils._rebuild_tensor_v2`` from storages named by ``persistent_load`` ids.

This reader treats every file as hostile (a checkpoint may come with a request): a restricted unpickler, checked
tensor geometry and bounded sizes (:func:`load_torch_file`; docs/security.md, "Checkpoints"). Every problem is a
:class:`CheckpointError` naming the file. Tensors come back as numpy arrays in their stored dtype (usually
float16; bfloat16 becomes float32)."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint file is missing, corrupt, truncated, of the wrong kind or of an unsupported version."""

    def __init__(self, path: str | os.PathLike | None, message: str):
        self.path = None if path is None else str(path)
        super().__init__(f"{self.path}: {message}" if self.path else message)


# torch storage class name -> numpy dtype (bfloat16 storages are widened to float32)
_STORAGE_DTYPES = {
    "HalfStorage": "<f2",
    "FloatStorage": "<f4",
    "DoubleStorage": "<f8",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}
_STORAGE_ITEMSIZE = {"bfloat16": 2}

# Plain numeric dtypes a pickled numpy scalar may name (``numpy.dtype(code, align, copy)``).
_SCALAR_DTYPES = frozenset(
    {"f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1", "?", "c8", "c16"}
)

# Magic 2-byte tags that upstream GPT-SoVITS writes over "PK" (process_ckpt.my_save2 / head2version).
VERSION_TAGS = {
    b"00": "v1",
    b"01": "v2",
    b"02": "v3",
    b"03": "v3-lora",
    b"04": "v4-lora",
    b"05": "v2Pro",
    b"06": "v2ProPlus",
    b"07": "v5",
    b"08": "v5",
}

MAX_PICKLE_BYTES = 4 << 20  # data.pkl holds names and config only (a released SoVITS file's: ~100 KB)
MAX_MARKS = 256  # open MARKs (nested tuples/lists/dicts being built) at once
MAX_INFLATION = 16  # the archive's members together may declare at most this many times the file's size ...
INFLATION_ALLOWANCE = 16 << 20  # ... plus this (a small file of compressed zeros)
MAX_MEMBERS = 100_000
MAX_DIMS = 32
BROADCAST_ALLOWANCE = 4096  # elements an overlapping/stride-0 view may hold beyond its storage's size
MATERIALISE_ALLOWANCE = 16 << 20  # bytes all tensors of one load may hold beyond twice their storages
MAX_DEPTH = 64  # nesting of the unpickled containers


class HParams(dict):
    """Stand-in for upstream ``utils.HParams``: a dict whose items are also attributes.

    Pickled HParams objects restore their ``__dict__``; nested HParams become nested HParams. Each load
    gets its own subclass of this class (:func:`_fresh_hparams`), so nothing a file does to the class it
    was handed reaches another load.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc

    def __setstate__(self, state: dict) -> None:
        self.update(state)


def _fresh_hparams() -> type[HParams]:
    return type("HParams", (HParams,), {"__module__": HParams.__module__, "__qualname__": "HParams"})


class _StorageType(NamedTuple):
    """A torch storage class as the unpickler hands it out: immutable, one per name and load."""

    name: str
    dtype: str


def _bfloat16_to_float32(raw: bytes) -> np.ndarray:
    u16 = np.frombuffer(raw, dtype="<u2")
    return (u16.astype("<u4") << 16).view("<f4")


def _int(value: Any, what: str) -> int:
    """A pickled integer (Python int or numpy integer, never a bool or anything else)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise pickle.UnpicklingError(f"{what} is a {type(value).__name__}, expected an integer")
    value = int(value)
    if abs(value) > 1 << 62:
        raise pickle.UnpicklingError(f"{what} is out of range")
    return value


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS:
        raise pickle.UnpicklingError(f"{what} must be a tuple of at most {MAX_DIMS} integers")
    return tuple(_int(v, what) for v in value)


def _state_dict(state: Any) -> dict[str, Any]:
    """The instance state a BUILD may apply: a dict of plain (non-dunder) attribute names."""
    if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
        state = state[0]
    if not isinstance(state, dict) or any(not isinstance(k, str) or k.startswith("__") for k in state):
        raise pickle.UnpicklingError("refusing BUILD: the state is not a dict of plain attribute names")
    return state


class _RestrictedUnpickler(pickle._Unpickler):  # the Python unpickler: its opcodes can be restricted
    """One load's unpickler: its globals, storages and budget belong to this load alone."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, path: Path):
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._prefix = prefix
        self._path = path
        self._storages: dict[str, tuple[_StorageType, int, np.ndarray]] = {}
        self._storage_ids: set[int] = set()
        self._storage_bytes = 0
        self._materialised = 0
        self._hparams = _fresh_hparams()
        self._dtypes: list[np.dtype] = []  # the dtypes this load made (BUILD on them is checked, not applied)
        self._allowed = self._globals()

    # -- the globals a checkpoint may name: built per load ----------------------------------------------
    def _globals(self) -> dict[tuple[str, str], Any]:
        allowed: dict[tuple[str, str], Any] = {
            ("collections", "OrderedDict"): OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2"): self._rebuild_tensor,
            ("torch._utils", "_rebuild_tensor"): self._rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"): self._rebuild_parameter,
            ("utils", "HParams"): self._hparams,
            ("GPT_SoVITS.utils", "HParams"): self._hparams,
            ("numpy", "dtype"): self._dtype,
            ("numpy.core.multiarray", "scalar"): self._numpy_scalar,
            ("numpy._core.multiarray", "scalar"): self._numpy_scalar,
            ("_codecs", "encode"): self._encode,
        }
        for name, dtype in _STORAGE_DTYPES.items():
            allowed[("torch", name)] = _StorageType(name, dtype)
        return allowed

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):
            raise pickle.UnpicklingError(
                f"refusing to load '{module}.{name}': not a tensor/config type a checkpoint needs"
            ) from None

    def _encode(self, text: Any, encoding: Any = "latin1") -> bytes:
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
            raise pickle.UnpicklingError("_codecs.encode takes a str and latin1/utf-8 here")
        return text.encode(encoding)

    def _dtype(self, code: Any, align: Any = False, copy: Any = True) -> np.dtype:
        if not isinstance(code, str) or code not in _SCALAR_DTYPES:
            raise pickle.UnpicklingError(f"refusing numpy dtype {code!r:.40}: not a plain numeric type")
        dtype = np.dtype(code, copy=True)  # this load's own copy
        self._dtypes.append(dtype)
        return dtype

    def _numpy_scalar(self, dtype: Any, data: Any = None) -> np.generic:
        if not any(dtype is d for d in self._dtypes):
            raise pickle.UnpicklingError("a numpy scalar needs a numpy dtype made by this checkpoint")
        if data is None:
            return dtype.type(0)
        if not isinstance(data, bytes) or len(data) != dtype.itemsize:
            raise pickle.UnpicklingError(f"numpy scalar data is not {dtype.itemsize} bytes")
        return np.frombuffer(data, dtype=dtype.newbyteorder("<"))[0]

    def _rebuild_parameter(self, data: Any, *_args: Any, **_kwargs: Any) -> np.ndarray:
        if not isinstance(data, np.ndarray):
            raise pickle.UnpicklingError("a parameter must wrap a tensor")
        return data

    # -- tensors -----------------------------------------------------------------------------------------
    def _rebuild_tensor(self, storage: Any, storage_offset: Any, size: Any, stride: Any, *_a: Any,
                        **_kw: Any) -> np.ndarray:
        """``torch._utils._rebuild_tensor_v2``: the tensor (a fresh contiguous array) that views ``storage``
        at ``storage_offset`` with ``size`` and ``stride`` (in elements), checked against the storage."""
        if not isinstance(storage, np.ndarray) or id(storage) not in self._storage_ids:
            raise pickle.UnpicklingError("a tensor's storage must be a storage of this checkpoint")
        flat = storage
        offset = _int(storage_offset, "storage offset")
        size = _ints(size, "tensor size")
        stride = _ints(stride, "tensor stride")
        if len(stride) != len(size):
            raise pickle.UnpicklingError(f"tensor has {len(size)} sizes but {len(stride)} strides")
        if offset < 0 or any(n < 0 for n in size) or any(s < 0 for s in stride):
            raise pickle.UnpicklingError("tensor has a negative storage offset, size or stride")
        if offset > flat.size:
            raise pickle.UnpicklingError(f"tensor offset {offset} lies past its storage ({flat.size} elements)")
        numel = 1
        for n in size:
            numel *= n
        if numel == 0:
            if any(n > 1 << 40 for n in size):
                raise pickle.UnpicklingError("empty tensor with an absurd size")
            return np.zeros(size, dtype=flat.dtype)
        span = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))
        if span > flat.size:
            raise pickle.UnpicklingError(
                f"tensor of size {size}, stride {stride} at offset {offset} overruns its storage ({flat.size} elements)"
            )
        if numel > flat.size + BROADCAST_ALLOWANCE:
            raise pickle.UnpicklingError(
                f"tensor of size {size} would expand its storage of {flat.size} elements (overlapping or "
                "stride-0 view): refused"
            )
        self._materialised += numel * flat.itemsize
        if self._materialised > 2 * self._storage_bytes + MATERIALISE_ALLOWANCE:
            raise pickle.UnpicklingError(
                f"the tensors rebuild more than twice their storages' {self._storage_bytes} bytes: refused"
            )
        strides = tuple(0 if n == 1 else s * flat.itemsize for n, s in zip(size, stride))
        view = np.lib.stride_tricks.as_strided(flat[offset:], shape=size, strides=strides, writeable=False)
        return view.copy(order="C")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
        storage_type, key = pid[1], pid[2]
        if not any(storage_type is t for t in self._allowed.values() if isinstance(t, _StorageType)):
            raise pickle.UnpicklingError(f"unsupported storage type {storage_type!r:.80}")
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            key = str(int(key))
        if not isinstance(key, str) or not 0 < len(key) <= 64 or "/" in key:
            raise pickle.UnpicklingError(f"unsupported storage key {key!r:.80}")
        numel = _int(pid[4], "storage size")
        if numel < 0:
            raise pickle.UnpicklingError(f"storage '{key}' has a negative size")
        if key in self._storages:
            known_type, known_numel, arr = self._storages[key]
            if known_type is not storage_type or known_numel != numel:
                raise pickle.UnpicklingError(f"storage '{key}' is named with two different types or sizes")
            return arr
        member = f"{self._prefix}data/{key}"
        try:
            info = self._archive.getinfo(member)
        except KeyError:
            raise pickle.UnpicklingError(f"storage '{member}' is missing from the archive") from None
        itemsize = _STORAGE_ITEMSIZE[storage_type.dtype] if storage_type.dtype in _STORAGE_ITEMSIZE else \
            np.dtype(storage_type.dtype).itemsize
        need = numel * itemsize
        if info.file_size < need:
            raise pickle.UnpicklingError(f"storage '{member}' is truncated ({info.file_size} < {need} bytes)")
        if info.file_size != need:
            raise pickle.UnpicklingError(
                f"storage '{member}' declares {info.file_size} bytes, its tensors record {need}"
            )
        raw = _read_member(self._archive, info, need)
        arr = _bfloat16_to_float32(raw) if storage_type.dtype == "bfloat16" else np.frombuffer(raw, storage_type.dtype)
        self._storages[key] = (storage_type, numel, arr)
        self._storage_ids.add(id(arr))
        self._storage_bytes += arr.nbytes
        return arr

    # -- opcodes that mutate an object: only this load's plain containers -------------------------------
    def _container(self, obj: Any, kinds: tuple[type, ...], op: str) -> Any:
        if type(obj) not in kinds:
            raise pickle.UnpicklingError(f"refusing {op} on a {type(obj).__name__}")
        return obj

    def _load_build(self) -> None:
        stack = self.stack
        state = stack.pop()
        inst = stack[-1]
        if any(inst is d for d in self._dtypes):  # numpy's dtype state: only plain little-endian is accepted
            if not (isinstance(state, tuple) and len(state) >= 5 and state[1] in ("<", "|", "=")
                    and state[2] is None and state[3] is None and state[4] is None):
                raise pickle.UnpicklingError("refusing numpy dtype state: only plain little-endian types")
            return
        if type(inst) is self._hparams:
            inst.update(_state_dict(state))
        elif type(inst) in (OrderedDict,):  # torch's state dicts carry a _metadata attribute
            inst.__dict__.update(_state_dict(state))
        else:
            raise pickle.UnpicklingError(f"refusing BUILD on a {type(inst).__name__}")

    def _load_setitem(self) -> None:
        stack = self.stack
        value = stack.pop()
        key = stack.pop()
        self._container(stack[-1], (dict, OrderedDict, self._hparams), "SETITEM")[key] = value

    def _load_setitems(self) -> None:
        items = self.pop_mark()
        target = self._container(self.stack[-1], (dict, OrderedDict, self._hparams), "SETITEMS")
        for i in range(0, len(items) - 1, 2):
            target[items[i]] = items[i + 1]

    def _load_append(self) -> None:
        value = self.stack.pop()
        self._container(self.stack[-1], (list,), "APPEND").append(value)

    def _load_appends(self) -> None:
        items = self.pop_mark()
        self._container(self.stack[-1], (list,), "APPENDS").extend(items)

    def _load_additems(self) -> None:
        items = self.pop_mark()
        self._container(self.stack[-1], (set,), "ADDITEMS").update(items)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if cls is not self._hparams and cls is not OrderedDict:
            raise pickle.UnpicklingError(f"refusing NEWOBJ of a {type(cls).__name__}")
        if not isinstance(args, tuple) or args:
            raise pickle.UnpicklingError("NEWOBJ of a config object takes no arguments")
        self.append(cls.__new__(cls))

    def _load_mark(self) -> None:
        if len(self.metastack) >= MAX_MARKS:
            raise pickle.UnpicklingError(f"more than {MAX_MARKS} nested MARKs")
        pickle._Unpickler.load_mark(self)

    def _refuse(self) -> None:
        raise pickle.UnpicklingError("refusing a pickle opcode checkpoints do not use (INST/OBJ/NEWOBJ_EX/EXT)")

    dispatch[pickle.BUILD[0]] = _load_build
    dispatch[pickle.SETITEM[0]] = _load_setitem
    dispatch[pickle.SETITEMS[0]] = _load_setitems
    dispatch[pickle.APPEND[0]] = _load_append
    dispatch[pickle.APPENDS[0]] = _load_appends
    dispatch[pickle.ADDITEMS[0]] = _load_additems
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.MARK[0]] = _load_mark
    for _op in (pickle.INST, pickle.OBJ, pickle.NEWOBJ_EX, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_op[0]] = _refuse
    del _op


def _children(item: Any) -> list | None:
    if isinstance(item, dict):
        extra = list(vars(item).values()) if hasattr(item, "__dict__") else []
        return [*item.keys(), *item.values(), *extra]
    if isinstance(item, (list, tuple, set, frozenset)):
        return list(item)
    return None


def _check_structure(path: Path, obj: Any) -> None:
    """The unpickled object is a finite tree of plain values: no cycle, at most :data:`MAX_DEPTH` deep."""
    entered, done = 1, 2
    state: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(obj, 0, False)]
    while stack:
        item, depth, leaving = stack.pop()
        if leaving:
            state[id(item)] = done
            continue
        children = _children(item)
        if children is None:
            continue
        mark = state.get(id(item))
        if mark == entered:
            raise CheckpointError(path, "the checkpoint holds a container that contains itself")
        if mark == done:
            continue
        if depth > MAX_DEPTH:
            raise CheckpointError(path, f"the checkpoint nests containers more than {MAX_DEPTH} deep")
        state[id(item)] = entered
        stack.append((item, depth, True))
        stack.extend((c, depth + 1, False) for c in children)


def read_header(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as f:
        return f.read(2)


class _PatchedHead(io.RawIOBase):
    """A file read as if its first two bytes were ``PK`` (version-tagged GPT-SoVITS files), without a copy."""

    def __init__(self, path: Path):
        self._f = open(path, "rb")  # noqa: SIM115 - closed with this object

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def readinto(self, buffer) -> int:
        pos = self._f.tell()
        n = self._f.readinto(buffer)
        if n and pos < 2:
            patch = b"PK"[pos : min(2, pos + n)]
            memoryview(buffer)[: len(patch)] = patch
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_archive(path: Path, head: bytes) -> zipfile.ZipFile:
    if head == b"PK":
        archive = zipfile.ZipFile(path)
    elif head in VERSION_TAGS:
        fh = io.BufferedReader(_PatchedHead(path))
        try:
            archive = zipfile.ZipFile(fh)
        except BaseException:
            fh.close()
            raise
        archive._patched = fh  # closed with the archive (see _close)
    elif head[:1] == b"\x80":
        raise CheckpointError(
            path, "legacy (pre-1.6) PyTorch serialization is not supported; re-save it with torch.save"
        )
    else:
        raise CheckpointError(path, "not a PyTorch checkpoint (the file does not start like a zip archive)")
    try:
        _check_archive(path, archive)
    except BaseException:
        _close(archive)
        raise
    return archive


def _close(archive: zipfile.ZipFile) -> None:
    archive.close()
    patched = getattr(archive, "_patched", None)
    if patched is not None:
        patched.close()


def _check_archive(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse an archive whose declared sizes do not fit the file, before anything is inflated."""
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise CheckpointError(path, f"archive has {len(infos)} members (at most {MAX_MEMBERS})")
    on_disk = path.stat().st_size
    declared = 0
    for info in infos:
        if info.flag_bits & 0x1:
            raise CheckpointError(path, f"archive member '{info.filename}' is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CheckpointError(path, f"archive member '{info.filename}' uses an unsupported compression")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise CheckpointError(path, f"archive member '{info.filename}' declares two different sizes")
        if info.header_offset + info.compress_size > on_disk:
            raise CheckpointError(path, f"archive member '{info.filename}' reaches past the end of the file")
        declared += info.file_size
    if declared > MAX_INFLATION * on_disk + INFLATION_ALLOWANCE:
        raise CheckpointError(
            path, f"archive declares {declared} bytes inflated from a {on_disk}-byte file: refused (zip bomb?)"
        )


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int) -> bytes:
    """Exactly ``size`` bytes of ``info`` (its declared size), inflating no more than that."""
    with archive.open(info) as f:
        data = f.read(size)
        if len(data) != size:
            raise pickle.UnpicklingError(f"archive member '{info.filename}' is truncated")
        if size == info.file_size:
            f.read(1)  # reaches the end: the zip module checks the CRC
    return data


def _pickle_member(path: Path, archive: zipfile.ZipFile) -> tuple[zipfile.ZipInfo, str]:
    pkls = [i for i in archive.infolist() if i.filename.endswith("data.pkl")]
    if not pkls:
        raise CheckpointError(path, "archive has no data.pkl: not a torch.save file")
    info = min(pkls, key=lambda i: len(i.filename))
    if info.file_size > MAX_PICKLE_BYTES:
        raise CheckpointError(path, f"data.pkl declares {info.file_size} bytes (at most {MAX_PICKLE_BYTES})")
    return info, info.filename[: -len("data.pkl")]


def pickle_bytes(path: str | os.PathLike) -> bytes:
    """The raw ``data.pkl`` of a ``torch.save`` archive (tensor names and config, no tensor data): a
    cheap way to tell what a file holds without unpickling it. Raises :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    try:
        archive = _open_archive(path, read_header(path))
        try:
            info, _ = _pickle_member(path, archive)
            return _read_member(archive, info, info.file_size)
        finally:
            _close(archive)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, pickle.UnpicklingError, OSError, EOFError, ValueError, struct.error) as exc:
        raise CheckpointError(path, f"corrupt or truncated archive ({exc})") from None
    except Exception as exc:  # zlib.error, ... from a damaged file
        raise CheckpointError(path, f"corrupt archive ({type(exc).__name__}: {exc})") from None


def load_torch_file(path: str | os.PathLike) -> Any:
    """Load a ``torch.save`` zip archive (also one whose "PK" magic was replaced by a version tag).

    Returns the unpickled object with tensors as numpy arrays. Raises :class:`CheckpointError`
    naming the file for anything unreadable or refused:

    - a *restricted* unpickler resolves only the handful of globals that checkpoint files need (tensor
      rebuilding, storages, ``OrderedDict``, the ``utils.HParams`` config object of SoVITS files and plain
      numpy scalars); anything else is refused, so loading a file cannot run arbitrary code;
    - every object it hands out is made for that load or immutable, and the opcodes that mutate an object
      (``BUILD``, ``SETITEM(S)``, ``APPEND(S)``, ``ADDITEMS``, ``NEWOBJ``) act only on the plain containers and
      config objects a checkpoint builds, never on a class, a function, a dtype or a storage: one file cannot
      change how a later one loads;
    - a tensor's geometry (offset, sizes, strides) is checked against its storage on both ends, and an
      overlapping or stride-0 view is materialised only up to the size of its storage (plus
      :data:`BROADCAST_ALLOWANCE` elements); all tensors of one load together materialise at most twice the
      storage bytes plus :data:`MATERIALISE_ALLOWANCE`;
    - the zip archive's declared sizes are checked before anything is inflated: the sum of the members' sizes
      against the file's size (:data:`MAX_INFLATION`), each storage member against what its tensors record,
      ``data.pkl`` against :data:`MAX_PICKLE_BYTES` (with at most :data:`MAX_MARKS` open MARKs, its program stays
      within a few seconds and ~100 MB)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    try:
        archive = _open_archive(path, read_header(path))
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, struct.error) as exc:
        raise CheckpointError(path, f"corrupt or truncated archive ({exc})") from None
    except Exception as exc:
        raise CheckpointError(path, f"corrupt archive ({type(exc).__name__}: {exc})") from None

    try:
        info, prefix = _pickle_member(path, archive)
        try:
            order = archive.getinfo(prefix + "byteorder")
        except KeyError:
            byteorder = "little"
        else:
            byteorder = _read_member(archive, order, order.file_size if order.file_size <= 16 else 16)
            byteorder = byteorder.decode("ascii", "replace").strip()
        if byteorder != "little":
            raise CheckpointError(path, f"big-endian checkpoints are not supported ({byteorder[:16]!r})")
        data = _read_member(archive, info, info.file_size)
        obj = _RestrictedUnpickler(data, archive, prefix, path).load()
    except CheckpointError:
        raise
    except RecursionError:
        raise CheckpointError(path, "cannot read checkpoint: nested too deeply") from None
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(path, f"cannot read checkpoint: {exc or type(exc).__name__}") from None
    except Exception as exc:  # zlib.error, struct.error, TypeError, ... from a damaged file
        raise CheckpointError(path, f"corrupt checkpoint ({type(exc).__name__}: {exc})") from None
    finally:
        _close(archive)
    _check_structure(path, obj)
    return obj
