"""Build the package's C sources (``csrc/``) into shared libraries, once per source and flags.

One helper for every native piece: the BLAS shim (``_blas``) and the float16-weight kernels
(``models/kernels/half_gemv.py``). :func:`compile_shared` compiles ``csrc/<name>.c`` with the system C compiler (``CC``,
else cc, gcc or clang on PATH: the one ``mx.compile`` needs too) into the package's cache folder
(``PRIMESPEECH_CACHE_DIR``), named by a hash of the sources in ``csrc/`` and the flags, and written atomically, so
a changed source or flag set builds a new library and concurrent processes never load a half-written one. Every
build runs with ``-Wall -Wextra``; a failed build raises :class:`BuildError` with the compiler's messages. The
compiler and the cache folder are process-wide settings (``settings.process_setting``): the BLAS shim is built
before MLX loads, before any engine exists. Which build of the kernels a model uses is its runtime's choice
(``runtime.Runtime.isa``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .settings import process_setting

CSRC = Path(__file__).resolve().with_name("csrc")
WARNINGS = ["-Wall", "-Wextra"]
ISAS = ("auto", "avx512", "avx2", "generic", "none")


class BuildError(RuntimeError):
    """A C source could not be compiled (no compiler, or the compiler failed)."""


def c_compiler() -> str | None:
    """The C compiler for the native helpers (``CC``, else cc, gcc or clang on PATH)."""
    return process_setting("cc") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def source(name: str) -> Path:
    """The path of ``csrc/<name>.c`` (``name``: letters, digits and underscores)."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise BuildError(f"bad C source name {name!r} (letters, digits and underscores only)")
    path = CSRC / f"{name}.c"
    if not path.is_file():
        raise BuildError(f"no C source {path}")
    return path


def _digest(name: str, flags: list[str]) -> str:
    """A hash of ``name``, the flags and every file in ``csrc/`` (a source includes its headers)."""
    h = hashlib.sha1(name.encode())
    for path in sorted(CSRC.glob("*.[ch]")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update("\0".join(flags).encode())
    return h.hexdigest()[:12]


def compile_shared(name: str, flags: list[str], libs: list[str] | None = None) -> str:
    """Build ``csrc/<name>.c`` into a shared library once (cached per sources and flags in the package's cache
    folder, written atomically) and return its path. ``flags``: compiler options (e.g. ``-mavx2``); ``libs``: what
    to link (after the source)."""
    src = source(name)
    cc = c_compiler()
    if not cc:
        raise BuildError(f"no C compiler found to build {name} (install gcc, or set CC)")
    libs = list(libs or [])
    out = Path(process_setting("cache_dir")) / f"{name}-{_digest(name, flags + libs)}.so"
    if out.is_file():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / f"{name}.so"
        cmd = [cc, "-O2", "-shared", "-fPIC", *WARNINGS, *flags, f"-I{CSRC}", str(src), "-o", str(tmp_out), *libs]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BuildError(f"cannot run {cc} to build {name}: {exc}") from None
        if done.returncode != 0:
            raise BuildError(f"{cc} failed to build {name} ({' '.join(flags)}): {done.stderr.strip()[-2000:]}")
        os.replace(tmp_out, out)
    return str(out)

