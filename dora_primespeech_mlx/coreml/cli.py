"""``primespeech-mlx export-coreml``: build the CoreML packages of the encoders (works on Linux too).

Targets are voice names (their HuBERT and BERT) or model folders (original or converted); with no
target the shared encoders of the model directory are exported. Without ``--output`` the packages go
to the cache the runtime uses (``<model_dir>/coreml``; existing ones are kept unless ``--force``).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _targets(args) -> list[tuple[str, Path]]:
    from ..assets.catalog import encoder_info, resolve_voice
    from ..convert.load import detect_kind
    from ..paths import originals_dir

    root = Path(args.model_dir)  # --model-dir or PRIMESPEECH_MODEL_DIR, resolved by the CLI (cli.resolve_places)
    out: list[tuple[str, Path]] = []
    if not args.targets:
        enc = encoder_info()
        base = originals_dir(root)
        out = [("hubert", base / enc.hubert), ("bert", base / enc.bert)]
    for target in args.targets:
        path = Path(target).expanduser()
        if path.exists():
            kind = args.kind or detect_kind(path)
            if kind not in ("hubert", "bert"):
                raise ValueError(f"{path} holds a {kind} model; only the hubert and bert encoders are exported")
            out.append((kind, path))
        else:
            spec = resolve_voice(target, root, **args.catalog)
            out += [("hubert", spec.hubert), ("bert", spec.bert)]
    if args.kind:
        out = [(k, p) for k, p in out if k == args.kind]
    seen, unique = set(), []
    for kind, path in out:
        if not path.exists():
            raise FileNotFoundError(f"{kind} model {path} not found (primespeech-mlx download encoders)")
        if (kind, path.resolve()) not in seen:
            seen.add((kind, path.resolve()))
            unique.append((kind, path))
    return unique


def cmd_export_coreml(args) -> int:
    from tqdm import tqdm

    from .export import PACKAGE_META, export_encoder, package_path

    root = Path(args.model_dir)  # --model-dir or PRIMESPEECH_MODEL_DIR (cli.resolve_places)
    buckets = None
    if args.buckets:
        if not args.kind:
            raise ValueError("--buckets needs --kind (samples for hubert, tokens for bert)")
        try:
            buckets = [int(b) for b in args.buckets.split(",")]
        except ValueError:
            raise ValueError(f"--buckets {args.buckets!r}: expected comma-separated integers") from None
    for kind, src in tqdm(_targets(args), desc="exporting CoreML encoders", unit="model"):
        if args.output:
            dst = Path(args.output).expanduser() / f"{kind}-{src.name}-{args.precision}.mlpackage"
        else:
            dst = package_path(src, kind, args.precision, root)
        if dst.is_dir() and (dst / PACKAGE_META).is_file() and not args.force and not buckets:
            print(f"{kind}: {dst} (exists)")
            continue
        export_encoder(src, kind, dst, args.precision, buckets)
        print(f"{kind}: {src} -> {dst}")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    s = subparsers.add_parser(
        "export-coreml",
        help="export the HuBERT and BERT encoders to CoreML .mlpackage files (ANE; no torch needed)",
        description="Build the CoreML packages of the encoders (works on Linux too). Targets are voice names "
        "(their HuBERT and BERT) or model folders (original or converted); with no target the shared encoders "
        "of the model directory are exported. Without --output the packages go to the cache the runtime uses "
        "(<model_dir>/coreml; existing ones are kept unless --force).",
    )
    s.add_argument("targets", nargs="*", help="voice names or model folders (default: the shared encoders)")
    s.add_argument("--kind", choices=["hubert", "bert"], help="only this encoder (or the kind of a folder)")
    s.add_argument("--precision", choices=["fp16", "fp32"], default="fp16", help="compute precision (default fp16)")
    s.add_argument("-o", "--output", help="write the packages into this folder instead of the cache")
    s.add_argument("--buckets", help="comma-separated bucket sizes (samples for hubert, tokens for bert); "
                   "needs --kind")
    s.add_argument("--force", action="store_true", help="re-export packages that already exist")
    s.set_defaults(func=cmd_export_coreml)
    return s
