"""Data files of the original text front end: where they live, how they are obtained and checked.

The English (and Chinese) front ends read dictionaries that the original GPT-SoVITS ships in
``GPT_SoVITS/text/``. They are not part of this package. :func:`data_file` returns the path of one
of them inside the caller's :attr:`TextData.folder <.options.TextData>` (``PRIMESPEECH_TEXT_DATA`` or
``<model_dir>/text-data``), downloading it on first use from the pinned upstream commit. Every file
is checked against the SHA-256 pinned below; a mismatch is an error, never a silent wrong result.

Upstream keeps the name dictionary as a pickle (``namedict_cache.pickle``). It is downloaded, read
with a restricted unpickler (plain dict/list/str/tuple only, so no code can run) and stored as
``namedict.json``; the pinned checksum is that of the JSON.

NLTK data (the POS tagger used for English homographs, and what ``g2p_en`` checks for on import) is
handled by :func:`ensure_nltk_data`: NLTK's own search path first (``$NLTK_DATA`` ...), then a
download into the caller's :attr:`TextData.nltk_folder <.options.TextData>`.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import pickle
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import TextFrontendError
from .options import TextData

logger = logging.getLogger(__name__)

UPSTREAM_REPO = "RVC-Boss/GPT-SoVITS"
UPSTREAM_COMMIT = "48b1a0169a28582a8984402f82cf438d3bfa6aca"
UPSTREAM_RAW_URL = f"https://raw.githubusercontent.com/{UPSTREAM_REPO}/{UPSTREAM_COMMIT}/GPT_SoVITS/text/"

DOWNLOAD_TIMEOUT_S = 60


def namedict_pickle_to_json(raw: bytes) -> bytes:
    """Convert upstream's ``namedict_cache.pickle`` (name -> list of pronunciations) to compact JSON.

    Only the builtins dict/list/str/tuple may appear in the pickle; anything else is refused.
    """
    obj = _RestrictedUnpickler(io.BytesIO(raw)).load()
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, (list, tuple)) and all(isinstance(p, (list, tuple)) for p in v)
        for k, v in obj.items()
    ):
        raise TextFrontendError("namedict_cache.pickle does not hold a dict of name -> list of pronunciations")
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class _RestrictedUnpickler(pickle.Unpickler):
    _ALLOWED = frozenset({("builtins", "dict"), ("builtins", "list"), ("builtins", "str"), ("builtins", "tuple")})

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise TextFrontendError(f"refusing to load {module}.{name} from a dictionary pickle")


@dataclass(frozen=True)
class DataFile:
    name: str  # file name inside TextData.folder
    sha256: str  # checksum of the file as stored there (after `convert`)
    source: str  # file name in upstream's GPT_SoVITS/text/
    convert: Callable[[bytes], bytes] | None = None  # upstream bytes -> stored bytes

    @property
    def url(self) -> str:
        return UPSTREAM_RAW_URL + self.source


DATA_FILES: dict[str, DataFile] = {
    f.name: f
    for f in (
        DataFile("cmudict.rep", "0e601d017d6e6f958443d41cd8922b4cd7598b3ba2056253a33f3e5a35f38494", "cmudict.rep"),
        DataFile(
            "cmudict-fast.rep",
            "53bfef0f27d7dd74d1ba74563d1e076d3e0672ce3596cb2d6c0d52ac9ad01f6d",
            "cmudict-fast.rep",
        ),
        DataFile(
            "engdict-hot.rep", "1c80418fe6fe5d537302ae67afd3612478997b35f2cf37cff52f959ed4334a71", "engdict-hot.rep"
        ),
        DataFile(
            "namedict.json",
            "0cf6aeb3c3d63778298ee78033484c217a2dfa33b3c38d9d25929f2210ac4d19",
            "namedict_cache.pickle",
            namedict_pickle_to_json,
        ),
        DataFile(
            "opencpop-strict.txt",
            "d66bbb1380a8ebf17d7ace5bf4b459f3728a469eea2aaeae2aeb3969b88223ff",
            "opencpop-strict.txt",
        ),
    )
}


def data_file(name: str, *, data: TextData) -> Path:
    """Path of the verified data file ``name`` (a key of :data:`DATA_FILES`) in ``data.folder``, downloading it
    if absent.

    Raises :class:`TextFrontendError` when the file is corrupt (checksum mismatch) or cannot be obtained.
    """
    spec = _spec(name)
    path = Path(data.folder) / name
    if path.is_file():
        _verify_stored(path, spec)
        return path
    raw = _download(spec, path)
    _store(spec, raw, path, origin=spec.url)
    return path


def install_file(name: str, source_path: str | os.PathLike, *, data: TextData) -> Path:
    """Install ``name`` into ``data.folder`` from a local copy of its upstream file (for machines without
    network).

    ``source_path`` is upstream's ``GPT_SoVITS/text/<source>`` (e.g. ``namedict_cache.pickle`` for
    ``namedict.json``); it is converted and checked like a download.
    """
    spec = _spec(name)
    path = Path(data.folder) / name
    _store(spec, Path(source_path).read_bytes(), path, origin=str(source_path))
    return path


def fetch_url(url: str) -> bytes:
    """Download ``url`` into memory, with a progress bar. (Tests replace this function.)"""
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        chunks = []
        with _progress(total, url.rsplit("/", 1)[-1]) as bar:
            while chunk := response.read(1 << 16):
                chunks.append(chunk)
                bar.update(len(chunk))
    return b"".join(chunks)


def _spec(name: str) -> DataFile:
    try:
        return DATA_FILES[name]
    except KeyError:
        raise TextFrontendError(f"unknown text data file {name!r}; known: {sorted(DATA_FILES)}") from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manual_hint(spec: DataFile, target: Path) -> str:
    if spec.convert is not None:
        how = (
            f'download {spec.url} and convert it into {target} with `python -c "from pathlib import Path; '
            f"from dora_primespeech_mlx.text.data import install_file; from dora_primespeech_mlx.text.options "
            f"import TextData; install_file('{spec.name}', '<path to {spec.source}>', "
            f"data=TextData(Path('{target.parent}'), Path('{target.parent}')))\"`"
        )
    else:
        how = f"download {spec.url} and save it as {target}"
    return (
        f"To provide it manually, {how}; or set PRIMESPEECH_TEXT_DATA to a folder holding a verified "
        f"{spec.name} (sha256 {spec.sha256})."
    )


def _verify_stored(path: Path, spec: DataFile) -> None:
    stat = path.stat()
    if _verified_ok(str(path), stat.st_size, stat.st_mtime_ns, spec.sha256):
        return
    raise TextFrontendError(
        f"text data file {path} is corrupt or of the wrong version: its sha256 differs from the pinned "
        f"{spec.sha256} (upstream {UPSTREAM_REPO}@{UPSTREAM_COMMIT[:7]}). Delete it to download it again. "
        + _manual_hint(spec, path)
    )


@functools.lru_cache(maxsize=64)
def _verified_ok(path: str, size: int, mtime_ns: int, sha256: str) -> bool:
    """Hash a stored file once per (path, size, mtime): dictionaries are read often, hashed once."""
    return _sha256(Path(path).read_bytes()) == sha256


def _download(spec: DataFile, path: Path) -> bytes:
    logger.info("Downloading %s from %s into %s", spec.name, spec.url, path.parent)
    try:
        return fetch_url(spec.url)
    except Exception as err:  # any transport failure (offline, DNS, HTTP error, timeout)
        raise TextFrontendError(
            f"text data file {spec.name} is not in {path.parent} and downloading it from {spec.url} failed "
            f"({type(err).__name__}: {err}). " + _manual_hint(spec, path)
        ) from err


def _store(spec: DataFile, raw: bytes, path: Path, origin: str) -> None:
    data = spec.convert(raw) if spec.convert is not None else raw
    digest = _sha256(data)
    if digest != spec.sha256:
        raise TextFrontendError(
            f"{spec.name} obtained from {origin} has sha256 {digest}, expected {spec.sha256}; "
            f"nothing was written. " + _manual_hint(spec, path)
        )
    try:
        _atomic_write(path, data)
    except OSError as err:
        raise TextFrontendError(
            f"cannot write text data file {path} ({type(err).__name__}: {err}). " + _manual_hint(spec, path)
        ) from err


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename, so no half-written file remains."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; these are shared read-only data files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _progress(total: int | None, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bars are a nicety
        return _NoProgress()
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int) -> None:
        pass


# ---------------------------------------------------------------------------------------------- NLTK

# (package id for nltk.download, resource path nltk.data.find looks for)
NLTK_PACKAGES = (
    # The POS tagger NLTK >= 3.9 loads for pos_tag (English homographs).
    ("averaged_perceptron_tagger_eng", "taggers/averaged_perceptron_tagger_eng/"),
    # g2p_en checks these two on import and calls nltk.download itself when they are missing.
    ("averaged_perceptron_tagger", "taggers/averaged_perceptron_tagger.zip"),
    ("cmudict", "corpora/cmudict.zip"),
)


def nltk_download(package: str, download_dir: str) -> bool:
    """``nltk.download`` without console noise; True on success. (Tests replace this function.)"""
    import nltk

    return bool(nltk.download(package, download_dir=download_dir, quiet=True, raise_on_error=True))


def ensure_nltk_data(packages: tuple[str, ...] | None = None, user: str = "the English front end", *,
                     data: TextData) -> None:
    """Make sure NLTK finds the data the English front end needs (or only ``packages`` of
    :data:`NLTK_PACKAGES`, for ``user``); download what is missing.

    NLTK's own search path (``$NLTK_DATA``, ``~/nltk_data``, ...) is used first; missing packages are
    downloaded into ``data.nltk_folder``, which is added to the path (NLTK's path is process-wide).
    Raises :class:`TextFrontendError` when a package is missing and cannot be downloaded. Done once per
    folder, packages and user.
    """
    _ensure_nltk_data(Path(data.nltk_folder), packages, user)


@functools.lru_cache(maxsize=4)
def _ensure_nltk_data(folder: Path, packages: tuple[str, ...] | None, user: str) -> None:
    import nltk

    target = str(folder)
    if target not in nltk.data.path:
        nltk.data.path.append(target)
    for package, resource in NLTK_PACKAGES:
        if (packages is not None and package not in packages) or _nltk_has(resource):
            continue
        logger.warning("NLTK data %r not found on NLTK's path; downloading it into %s", package, target)
        error: Exception | None = None
        try:
            ok = nltk_download(package, target)
        except Exception as err:  # offline, HTTP error, bad index ...
            ok, error = False, err
        if not ok or not _nltk_has(resource):
            detail = f" ({type(error).__name__}: {error})" if error else ""
            raise TextFrontendError(
                f"NLTK data package {package!r} ({resource}) is needed by {user}, was not "
                f"found on NLTK's search path and could not be downloaded into {target}{detail}. "
                f"Install it with `python -m nltk.downloader -d {target} {package}` on a machine with "
                f"network, or set NLTK_DATA to a folder that holds it."
            ) from error


def _nltk_has(resource: str) -> bool:
    import nltk

    try:
        nltk.data.find(resource)
    except LookupError:
        return False
    return True
