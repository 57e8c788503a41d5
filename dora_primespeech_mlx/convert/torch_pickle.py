"""Read PyTorch ``torch.save`` zip archives without PyTorch.

A ``torch.save`` file is a zip archive holding ``<name>/data.pkl`` (a pickle) and one file per tensor
storage under ``<name>/data/<key>``. The pickle rebuilds tensors through
``torch._utils._rebuild_tensor_v2`` from storages named by ``persistent_load`` ids.

This reader uses a *restricted* unpickler: only the handful of globals that checkpoint files need are
resolved (tensor rebuilding, storages, ``OrderedDict``, the ``utils.HParams`` config object of SoVITS
files and plain numpy scalars); anything else is refused, so loading a file cannot run arbitrary code.
Tensors come back as numpy arrays in their stored dtype (usually float16).
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint file is missing, corrupt, truncated, of the wrong kind or of an unsupported version."""

    def __init__(self, path: str | os.PathLike | None, message: str):
        self.path = None if path is None else str(path)
        super().__init__(f"{self.path}: {message}" if self.path else message)


# torch storage class name -> numpy dtype
_STORAGE_DTYPES = {
    "HalfStorage": np.float16,
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "BFloat16Storage": "bfloat16",
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}

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


class HParams(dict):
    """Stand-in for upstream ``utils.HParams``: a dict whose items are also attributes.

    Pickled HParams objects restore their ``__dict__``; nested HParams become nested HParams.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc

    def __setstate__(self, state: dict) -> None:
        self.update(state)


class _StorageType:
    def __init__(self, name: str):
        self.name = name
        self.dtype = _STORAGE_DTYPES[name]


def _bfloat16_to_float32(raw: bytes) -> np.ndarray:
    u16 = np.frombuffer(raw, dtype=np.uint16)
    return (u16.astype(np.uint32) << 16).view(np.float32)


def _rebuild_tensor(storage, storage_offset, size, stride, *_args, **_kwargs) -> np.ndarray:
    flat: np.ndarray = storage
    size = tuple(int(s) for s in size)
    if len(size) == 0:
        return flat[storage_offset : storage_offset + 1].reshape(()).copy()
    stride = tuple(int(s) for s in stride)
    needed = storage_offset + 1 + sum((n - 1) * s for n, s in zip(size, stride) if n > 0)
    if any(n == 0 for n in size):
        return np.zeros(size, dtype=flat.dtype)
    if needed > flat.size:
        raise pickle.UnpicklingError(f"tensor of size {size} overruns its storage ({flat.size} elements)")
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[storage_offset:], shape=size, strides=tuple(s * item for s in stride), writeable=False
    )
    return np.ascontiguousarray(view)


def _rebuild_parameter(data, *_args, **_kwargs):
    return data


def _numpy_scalar(dtype, data=None):
    return np.frombuffer(data, dtype=dtype)[0] if data is not None else dtype.type(0)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("utils", "HParams"): HParams,
    ("GPT_SoVITS.utils", "HParams"): HParams,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
    ("_codecs", "encode"): lambda s, enc="latin1": s.encode(enc),
}
for _name in _STORAGE_DTYPES:
    _ALLOWED[("torch", _name)] = _StorageType(_name)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, path: str):
        super().__init__(file)
        self._archive = archive
        self._prefix = prefix
        self._path = path
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load '{module}.{name}': not a tensor/config type a checkpoint needs"
            ) from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unsupported storage type {storage_type!r}")
        if key not in self._storages:
            member = f"{self._prefix}data/{key}"
            try:
                raw = self._archive.read(member)
            except KeyError:
                raise pickle.UnpicklingError(f"storage '{member}' is missing from the archive") from None
            if storage_type.dtype == "bfloat16":
                arr = _bfloat16_to_float32(raw)
            else:
                arr = np.frombuffer(raw, dtype=storage_type.dtype)
            numel = int(pid[4])
            if arr.size < numel:
                raise pickle.UnpicklingError(f"storage '{member}' is truncated ({arr.size} < {numel})")
            self._storages[key] = arr
        return self._storages[key]


def read_header(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as f:
        return f.read(2)


def _open_archive(path: Path, head: bytes) -> zipfile.ZipFile:
    if head == b"PK":
        return zipfile.ZipFile(path)
    if head in VERSION_TAGS:
        data = bytearray(path.read_bytes())
        data[:2] = b"PK"
        return zipfile.ZipFile(io.BytesIO(bytes(data)))
    if head[:1] == b"\x80":
        raise CheckpointError(
            path, "legacy (pre-1.6) PyTorch serialization is not supported; re-save it with torch.save"
        )
    raise CheckpointError(path, f"not a PyTorch checkpoint (starts with {head!r})")


def pickle_bytes(path: str | os.PathLike) -> bytes:
    """The raw ``data.pkl`` of a ``torch.save`` archive (tensor names and config, no tensor data): a
    cheap way to tell what a file holds without unpickling it. Raises :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    try:
        with _open_archive(path, read_header(path)) as archive:
            pkls = [n for n in archive.namelist() if n.endswith("data.pkl")]
            if not pkls:
                raise CheckpointError(path, "archive has no data.pkl: not a torch.save file")
            return archive.read(min(pkls, key=len))
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CheckpointError(path, f"corrupt or truncated archive ({exc})") from None


def load_torch_file(path: str | os.PathLike) -> Any:
    """Load a ``torch.save`` zip archive (also one whose "PK" magic was replaced by a version tag).

    Returns the unpickled object with tensors as numpy arrays. Raises :class:`CheckpointError`
    naming the file for anything unreadable.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    head = read_header(path)
    try:
        archive = _open_archive(path, head)
    except zipfile.BadZipFile as exc:
        raise CheckpointError(path, f"corrupt or truncated archive ({exc})") from None

    with archive:
        pkls = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if not pkls:
            raise CheckpointError(path, "archive has no data.pkl: not a torch.save file")
        pkl = min(pkls, key=len)
        prefix = pkl[: -len("data.pkl")]
        try:
            byteorder = archive.read(prefix + "byteorder").decode().strip()
        except KeyError:
            byteorder = "little"
        if byteorder != "little":
            raise CheckpointError(path, f"big-endian checkpoints are not supported ({byteorder})")
        try:
            with archive.open(pkl) as f:
                return _RestrictedUnpickler(f, archive, prefix, str(path)).load()
        except CheckpointError:
            raise
        except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
            raise CheckpointError(path, f"cannot read checkpoint: {exc}") from None
        except Exception as exc:  # zlib.error, struct.error, ... from a damaged file
            raise CheckpointError(path, f"corrupt checkpoint ({type(exc).__name__}: {exc})") from None
