"""Build what the GPU check carries to the device machine (docs/gpu.md): run here, on a machine with network.

The device machine has Python 3.12 with torch, numpy, onnxruntime, tokenizers, safetensors, pyyaml and pyarrow,
but not MLX, and it reaches no registry. One call may carry 64 MiB (working tree included). The plain
``mlx-cuda-13`` wheel is larger than that alone, so the pack installs the wheels here into a staging folder for
CPython 3.12 / manylinux x86_64, makes MLX's library smaller, and writes one xz tarball:

- ``strip --strip-unneeded`` drops the library's static symbol table (its dynamic symbols stay);
- the CUDA fat binaries keep their headers, but the payloads for other GPUs than ``--keep-arch`` (default 90:
  the H100 / H200) are zeroed, so xz stores them as nothing. The CUDA driver loads the entry made for the
  device's own architecture; the zeroed ones are never read there. A card of another architecture needs a pack
  made with its ``--keep-arch``.

The fixtures go into one folder per device call (``PARTS``): each is a fixture root with only the files its tests
need (missing files make the other tests skip, so each part's tests run the case files unchanged).

usage: python tests/device/pack.py [--out .devpack] [--fixtures ../shared/fixtures] [--python312 PATH]
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 64 * 2**20  # what one device call may carry, working tree included
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 27, 28, 31, 35)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
# runtime dependencies the device image lacks (KINDS.md's package list), with what they need in turn (the English
# front end too: a Chinese voice warms it up when it loads)
WHEELS = ["mlx", "mlx-cuda-13", "soundfile", "cffi", "pycparser", "soxr", "pypinyin==0.55.0", "cn2an", "proces",
          "nltk", "defusedxml", "g2p_en==2.1.0", "inflect", "jaraco.functools", "more_itertools", "typeguard",
          "wordsegment==1.3.1"]
SDISTS = ["jieba_fast==0.53", "distance==0.1.3"]  # no wheels published: built here with a CPython 3.12
# NLTK data the English front end reads (the device cannot download it), copied into the site's nltk_data/
NLTK = ["taggers/averaged_perceptron_tagger_eng", "taggers/averaged_perceptron_tagger.zip", "corpora/cmudict"]
# ... and the original's English dictionaries (PRIMESPEECH_TEXT_DATA), copied into the site's text-data/
TEXT_DATA = ["cmudict.rep", "cmudict-fast.rep", "engdict-hot.rep", "namedict.json", "opencpop-strict.txt",
             "SHA256SUMS"]
# device call -> fixture globs (relative to the fixture root) it carries; the first part also carries the site
PARTS: dict[str, list[str]] = {
    "core": ["models/cases.json", "models/README.md", "models/gpt/*", "models/chinese-hubert-tiny/*",
             "models/chinese-roberta-tiny/*", "models/golden/gpt_*", "models/golden/bert_*",
             "models/golden/hubert.npz", "models/golden/e2e.npz", "models/ref_audio/*",
             "models-v2pro/cases.json", "models-v2pro/sv/*", "models-v2pro/golden/sv.npz"],
    "v2": ["models/**"],
    # (the v2Pro sets' cases.json names the GPT and encoders in ../models/)
    "v2pro": ["models/gpt/*", "models/chinese-hubert-tiny/*", "models/chinese-roberta-tiny/*",
              "models-v2pro/cases.json", "models-v2pro/sv/*", "models-v2pro/ref_audio/*",
              "models-v2pro/sovits/*s2Gv2Pro-*", "models-v2pro/golden/v2Pro_*", "models-v2pro/golden/sv.npz"],
    "v2proplus": ["models/gpt/*", "models/chinese-hubert-tiny/*", "models/chinese-roberta-tiny/*",
                  "models-v2pro/cases.json", "models-v2pro/sv/*", "models-v2pro/ref_audio/*",
                  "models-v2pro/sovits/*s2Gv2ProPlus-*", "models-v2pro/golden/v2ProPlus_*",
                  "models-v2pro/golden/sv.npz"],
}


def pip(args: list[str], python: str = sys.executable) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True)


def mlx_version() -> str:
    from importlib.metadata import version

    return version("mlx")


def download(dest: Path, python312: str | None) -> list[Path]:
    """The wheels for CPython 3.12 manylinux x86_64 (MLX at this machine's version), and the sdist-only packages
    built into wheels by ``python312``."""
    dest.mkdir(parents=True, exist_ok=True)
    names = [f"{n}=={mlx_version()}" if n in ("mlx", "mlx-cuda-13") else n for n in WHEELS]
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    pip(["download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
         *plat, "-d", str(dest), *names])
    if SDISTS:
        if not python312:
            raise SystemExit(f"error: {', '.join(SDISTS)} publish no wheels; give --python312 (a CPython 3.12)")
        pip(["wheel", "-q", "--no-deps", "-w", str(dest), *SDISTS], python=python312)
    return sorted(dest.glob("*.whl"))


def fatbin_section(data: bytes) -> tuple[int, int]:
    """(file offset, size) of the ELF64 section ``.nv_fatbin``."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]
    for name, _type, _flags, _addr, offset, size in sections:
        end = data.index(b"\0", names_at + name)
        if data[names_at + name:end] == b".nv_fatbin":
            return offset, size
    raise ValueError("no .nv_fatbin section")


def prune_fatbins(path: Path, keep_arch: int) -> dict[str, int]:
    """Zero, in place, the payload of every CUDA fat-binary entry not built for ``keep_arch`` (cubins of other
    architectures, and PTX newer than it, which its driver cannot compile). Returns bytes kept / zeroed."""
    data = bytearray(path.read_bytes())
    start, size = fatbin_section(data)
    kept = zeroed = 0
    pos, end = start, start + size
    while pos + 16 <= end:
        magic, _version, header, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:  # blobs are 8-byte aligned
            pos += 8
            continue
        entry, stop = pos + header, pos + header + fat_size
        while entry < stop:
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            body = entry + entry_header
            if arch == keep_arch or (kind == 1 and arch < keep_arch):
                kept += payload
            else:
                data[body:body + payload] = bytes(payload)
                zeroed += payload
            entry = body + payload
        pos = stop
    path.write_bytes(bytes(data))
    return {"kept": kept, "zeroed": zeroed}


def build_site(wheels: list[Path], stage: Path, out: Path, keep_arch: int, nltk_data: Path,
               text_data: Path) -> dict[str, int]:
    """Install the wheels for 3.12 into ``stage`` with the NLTK data and the English dictionaries beside them
    (``nltk_data/``, ``text-data/``), shrink MLX's library, write ``out`` (tar.xz)."""
    shutil.rmtree(stage, ignore_errors=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)] + ["--platform", "linux_x86_64"]
    pip(["install", "-q", "--no-index", "--no-deps", "--no-compile", "--only-binary=:all:", "--python-version",
         "3.12", "--implementation", "cp", *plat, "--target", str(stage), *map(str, wheels)])
    for rel in NLTK:
        src, dst = nltk_data / rel, stage / "nltk_data" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    (stage / "text-data").mkdir()
    for name in TEXT_DATA:
        shutil.copy2(text_data / name, stage / "text-data" / name)
    lib = stage / "mlx" / "lib" / "libmlx.so"
    subprocess.run(["strip", "--strip-unneeded", str(lib)], check=True)
    info = prune_fatbins(lib, keep_arch)
    out.unlink(missing_ok=True)
    env = dict(os.environ, XZ_OPT="-6 -T0")
    subprocess.run(["tar", "-cJf", str(out), "-C", str(stage), "."], check=True, env=env)
    shutil.rmtree(stage)
    return info


def fixture_files(root: Path) -> list[Path]:
    """Every file under ``root``, following linked folders (a fixture root's ``models/`` may be a symlink to
    another set; ``Path.rglob`` does not follow it)."""
    return sorted(Path(d) / name for d, _, names in os.walk(root, followlinks=True) for name in names
                  if (Path(d) / name).is_file())


def copy_part(root: Path, globs: list[str], dest: Path) -> int:
    """Copy the fixture files matching ``globs`` from ``root`` into ``dest``; their total size."""
    shutil.rmtree(dest, ignore_errors=True)
    total = 0
    for f in fixture_files(root):
        rel = f.relative_to(root).as_posix()
        if any(fnmatch.fnmatch(rel, g) for g in globs):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / rel)
            total += f.stat().st_size
    return total


def tree_size() -> int:
    """Bytes of the tracked and untracked-not-ignored files (what every call sends besides ``carry``)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True).stdout
    return sum((REPO / n).stat().st_size for n in out.decode().split("\0") if n and (REPO / n).is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / ".devpack"))
    ap.add_argument("--fixtures", default=os.environ.get("PRIMESPEECH_FIXTURES", str(REPO.parent / "shared/fixtures")))
    ap.add_argument("--nltk-data", default=os.environ.get("NLTK_DATA", str(REPO.parent / "shared/nltk_data")))
    ap.add_argument("--text-data", default=os.environ.get("PRIMESPEECH_TEXT_DATA",
                                                          str(REPO.parent / "shared/data/gpt-sovits-text")))
    ap.add_argument("--python312", default=shutil.which("python3.12"), help="a CPython 3.12 to build sdists with")
    ap.add_argument("--keep-arch", type=int, default=90, help="CUDA architecture kept in MLX's library (default 90)")
    ap.add_argument("--skip-site", action="store_true", help="only the fixture parts")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    sizes: dict[str, int] = {}
    if not a.skip_site:
        wheels = download(out / "wheels", a.python312)
        for w in wheels:
            print(f"wheel {w.name}: {w.stat().st_size / 2**20:.1f} MiB")
        info = build_site(wheels, out / "stage", out / "site.tar.xz", a.keep_arch, Path(a.nltk_data),
                          Path(a.text_data))
        print(f"libmlx.so fat binaries: kept {info['kept'] / 2**20:.1f} MiB, zeroed {info['zeroed'] / 2**20:.1f} MiB")
        shutil.rmtree(out / "wheels")
    site = (out / "site.tar.xz").stat().st_size if (out / "site.tar.xz").is_file() else 0
    tree = tree_size()
    for part, globs in PARTS.items():
        sizes[part] = copy_part(Path(a.fixtures), globs, out / f"fix-{part}")
    print(f"site.tar.xz {site / 2**20:.1f} MiB, working tree {tree / 2**20:.1f} MiB, limit {LIMIT / 2**20:.0f} MiB")
    for i, (part, size) in enumerate(sizes.items()):
        total = tree + size + (site if i == 0 else 0)
        print(f"call {i + 1} ({part}): fixtures {size / 2**20:.1f} MiB, carried in all {total / 2**20:.1f} MiB"
              + ("" if total <= LIMIT else "  OVER THE LIMIT"))
    return 0 if all(tree + s + (site if i == 0 else 0) <= LIMIT for i, s in enumerate(sizes.values())) else 1


if __name__ == "__main__":
    sys.exit(main())

