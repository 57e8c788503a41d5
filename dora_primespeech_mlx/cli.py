"""``primespeech-mlx``: speak, list/download/convert voices, inspect phonemes, benchmark, export CoreML."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _model_dir(args) -> Path | None:
    return Path(args.model_dir).expanduser() if getattr(args, "model_dir", None) else None


def cmd_voices(args) -> int:
    from .voices import list_voices

    voices = list_voices(_model_dir(args))
    if args.json:
        print(json.dumps([v.__dict__ for v in voices], ensure_ascii=False, indent=2))
        return 0
    width = max(len(v.name) for v in voices)
    for v in voices:
        mark = "installed" if v.installed else "available (primespeech-mlx download)"
        print(f"{v.name:<{width}}  {v.language:<6} speed {v.speed_factor:<4} {v.source:<6} {mark}")
    return 0


def cmd_download(args) -> int:
    from .download import download_encoders, download_sv, download_voice
    from .voices import preset_names

    root = _model_dir(args)
    names = args.voices
    if names == ["encoders"]:
        download_encoders(root)
        return 0
    if names == ["sv"]:  # the speaker-verification model of v2Pro / v2ProPlus voices
        download_sv(root)
        return 0
    if names == ["all"]:
        names = preset_names()
    for name in names:
        spec = download_voice(name, root, convert=not args.no_convert)
        print(f"{spec.name}: installed ({spec.gpt.parent.parent})")
    return 0


def cmd_convert(args) -> int:
    from .convert.load import convert, detect_kind

    src = Path(args.src)
    kind = args.kind or detect_kind(src)
    dst = Path(args.output) if args.output else src.with_name(src.stem + "-mlx")
    convert(src, dst, kind)
    print(f"{kind}: {src} -> {dst}")
    return 0


def cmd_zenoh_overlay(args) -> int:
    from .settings import ZENOH_OVERLAY

    print(ZENOH_OVERLAY)
    return 0


def cmd_phones(args) -> int:
    from . import settings
    from .text import phones_json

    llm = settings.read("llm_text") and not args.raw  # PRIMESPEECH_LLM_TEXT: what the node and `say` speak
    print(json.dumps(phones_json(args.text, args.lang, version=args.version, llm=llm), ensure_ascii=False, indent=2))
    return 0


def _synthesis_overrides(args) -> dict:
    out = {}
    for name in ("top_k", "top_p", "temperature", "repetition_penalty", "speed_factor", "seed",
                 "text_split_method", "fragment_interval"):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    if args.lang:
        out["text_lang"] = args.lang
    return out


def cmd_say(args) -> int:
    import numpy as np
    import soundfile as sf

    from .engine import GPTSoVITSEngine

    engine = GPTSoVITSEngine(model_dir=_model_dir(args), progress=lambda m: print(m, file=sys.stderr))
    engine.load_voice(args.voice)
    text = args.text if args.text != "-" else sys.stdin.read()
    overrides = _synthesis_overrides(args)
    t0 = time.perf_counter()
    if args.stream:
        parts, first = [], None
        for chunk in engine.synthesize_stream(text, **overrides):
            if first is None:
                first = time.perf_counter() - t0
                print(f"first audio after {first:.2f} s", file=sys.stderr)
            parts.append(chunk.audio)
            sr = chunk.sample_rate
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    else:
        result = engine.synthesize(text, **overrides)
        audio, sr = result.audio, result.sample_rate
    elapsed = time.perf_counter() - t0
    sf.write(args.output, audio, sr, subtype="PCM_16")
    dur = len(audio) / sr
    print(f"wrote {args.output}: {dur:.2f} s of audio in {elapsed:.2f} s (RTF {elapsed / max(dur, 1e-9):.2f})",
          file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="primespeech-mlx", description=__doc__)
    p.add_argument(
        "--model-dir",
        help="model directory (default: $PRIMESPEECH_MODEL_DIR, else ~/.dora/models/primespeech)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("say", help="speak a text into a WAV file")
    s.add_argument("text", help="text to speak ('-' reads standard input)")
    s.add_argument("--voice", default="Doubao")
    s.add_argument("-o", "--output", default="out.wav")
    s.add_argument("--stream", action="store_true", help="use streaming synthesis (reports time to first audio)")
    s.add_argument("--lang", help="text language: zh, en, ja, ko, yue, all_zh, all_ja, all_ko, all_yue, auto, auto_yue "
                   "(default: the voice's)")
    s.add_argument("--speed", dest="speed_factor", type=float)
    s.add_argument("--top-k", dest="top_k", type=int)
    s.add_argument("--top-p", dest="top_p", type=float)
    s.add_argument("--temperature", type=float)
    s.add_argument("--repetition-penalty", dest="repetition_penalty", type=float)
    s.add_argument("--seed", type=int)
    s.add_argument("--split", dest="text_split_method", help="cut0..cut5")
    s.add_argument("--fragment-interval", dest="fragment_interval", type=float)
    s.set_defaults(func=cmd_say)

    s = sub.add_parser("voices", help="list preset and user voices and whether they are installed")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_voices)

    s = sub.add_parser("download", help="download voices from Hugging Face and convert them (resumable)")
    s.add_argument(
        "voices", nargs="+", help="voice names, 'all', 'encoders', or 'sv' (the v2Pro speaker-verification model)"
    )
    s.add_argument("--no-convert", action="store_true", help="only download the original files")
    s.set_defaults(func=cmd_download)

    s = sub.add_parser("convert", help="convert a .ckpt/.pth/Hugging Face folder to the MLX format")
    s.add_argument("src")
    s.add_argument("-o", "--output", help="output folder (default: <src>-mlx)")
    s.add_argument("--kind", choices=["gpt", "sovits", "hubert", "bert", "sv"])
    s.set_defaults(func=cmd_convert)

    s = sub.add_parser("zenoh-overlay", help="print the path of the Zenoh overlay for dora 1.x "
                       "(DORA_ZENOH_CONFIG_OVERLAY / --zenoh-config-overlay: no dropped messages)")
    s.set_defaults(func=cmd_zenoh_overlay)

    s = sub.add_parser("phones", help="print the phonemes of a text as JSON (debugging voices); spoken_text and "
                       "norm_text show what is said after the LLM text stage")
    s.add_argument("text")
    s.add_argument("--lang", default="zh", help="zh, en, ja, ko, yue, all_zh, all_ja, all_ko, all_yue, auto, auto_yue")
    s.add_argument("--version", default="v2", choices=["v1", "v2"])
    s.add_argument("--raw", action="store_true", help="skip the LLM text stage (as PRIMESPEECH_LLM_TEXT=false): "
                   "phonemise the text exactly as given")
    s.set_defaults(func=cmd_phones)

    # Sub-commands that live next to their implementation.
    for module in ("bench", "coreml.cli"):
        try:
            mod = __import__(f"{__package__}.{module}", fromlist=["add_parser"])
        except ImportError:
            continue
        if hasattr(mod, "add_parser"):
            mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    import logging

    from .errors import PrimeSpeechError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (PrimeSpeechError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
