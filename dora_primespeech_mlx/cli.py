"""``primespeech-mlx``: speak, list/download/convert voices, inspect phonemes, benchmark, export CoreML.

Commands that load models check their cheap inputs first (text, options, output file, voice: :mod:`.cli_checks`)
so a mistake is answered before seconds of loading. A user error (this package's errors, a bad value, a file
that cannot be read or written) ends with one ``error:`` line and exit code 2, Ctrl-C with one line and 130;
anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import shlex
import sys
import time
from pathlib import Path

DESCRIPTION = "Speak with GPT-SoVITS voices on MLX; list, download and convert voices; inspect phonemes; " \
    "benchmark; export the CoreML encoders."
LANGS = "zh, en, ja, ko, yue, all_zh, all_ja, all_ko, all_yue, auto, auto_yue"
# Commands that live next to their implementation: module (under the package) -> command name
MODULE_COMMANDS = {"bench": "bench", "coreml.cli": "export-coreml", "cluster_keys": "cluster-keys"}
INTERRUPTED = 130  # the shell's code for a process ended by SIGINT (128 + 2)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help shows its default: appended where the help text does not state it already, left out
    where there is none (unset options say in their help what applies then; flags are off unless given)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def version() -> str:
    """The installed distribution's version (``unknown`` when the package runs from a bare checkout)."""
    try:
        return importlib.metadata.version("dora-primespeech-mlx")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def add_global_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """Options that every command takes, before or after the command's name. On the sub-commands their default
    is SUPPRESS, so a value given before the command is not overwritten by the sub-command's own default."""
    parser.add_argument(
        "--model-dir",
        default=None if top else argparse.SUPPRESS,
        help="model directory (default: $PRIMESPEECH_MODEL_DIR, else ~/.dora/models/primespeech)",
    )


def resolve_places(args) -> None:
    """Where the commands find models and voices, read here once for every command (the one place of the CLI
    that reads these settings; what runs below takes them as arguments): ``args.model_dir`` becomes ``--model-dir``
    or ``PRIMESPEECH_MODEL_DIR`` (else its default), ``args.catalog`` the voice lookups' keywords
    (``PRIMESPEECH_VOICES_DIR``, ``PRIMESPEECH_VOICE_UNKNOWN_KEYS``)."""
    from . import settings

    given = getattr(args, "model_dir", None)
    args.model_dir = Path(given).expanduser() if given else settings.read("model_dir")
    args.catalog = {"voices_dir": settings.read("voices_dir"), "unknown_keys": settings.read("voice_unknown_keys")}


def cmd_voices(args) -> int:
    from .assets.catalog import list_voices

    voices = list_voices(args.model_dir, **args.catalog)
    if args.json:
        print(json.dumps([v.__dict__ for v in voices], ensure_ascii=False, indent=2))
        return 0
    width = max(len(v.name) for v in voices)
    for v in voices:
        if v.error:  # a voice file that cannot be used: its reason (the other voices are unaffected)
            print(f"{v.name:<{width}}  broken: {v.error}")
            continue
        mark = "installed" if v.installed else "available (primespeech-mlx download)"
        print(f"{v.name:<{width}}  {v.language:<6} speed {v.speed_factor:<4} {v.source:<6} {mark}")
    return 0


def cmd_download(args) -> int:
    from .assets.catalog import preset_names, preset_voice
    from .assets.download import download_encoders, download_sv, download_voice
    from .engine.encoders import prepare_coreml

    root = args.model_dir
    names = args.voices
    if names == ["encoders"]:
        download_encoders(root)
        return 0
    if names == ["sv"]:  # the speaker-verification model of v2Pro / v2ProPlus voices
        download_sv(root)
        return 0
    if names == ["all"]:
        names = preset_names()
    for name in names:  # every name known before anything is downloaded
        preset_voice(name, root)
    for name in names:
        spec = download_voice(name, root, convert=not args.no_convert, after_convert=prepare_coreml)
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


def cmd_dataflow(args) -> int:
    """Write the shipped demo dataflow (the checkout's dataflow.yaml, packaged) into a folder, for users of the
    wheel: its nodes are console scripts, so it runs from there."""
    from importlib.resources import files

    target = Path(args.dir) / "dataflow.yaml"
    if target.exists() and not args.force:
        raise FileExistsError(f"{target} exists (--force overwrites it)")
    target.write_bytes(files(f"{__package__}.demo").joinpath("dataflow.yaml").read_bytes())
    where = "" if Path(args.dir).resolve() == Path.cwd() else f"cd {shlex.quote(args.dir)} && "
    print(f"wrote {target}; run it with:  {where}dora run dataflow.yaml")
    return 0


def cmd_zenoh_overlay(args) -> int:
    from .settings import ZENOH_OVERLAY

    print(ZENOH_OVERLAY)
    return 0


def cmd_phones(args) -> int:
    from .settings import Settings
    from .text import TextData, phones_json

    settings = Settings.from_env()
    llm = settings.llm_text and not args.raw  # PRIMESPEECH_LLM_TEXT: what the node and `say` speak
    data = TextData.from_settings(settings, args.model_dir)  # PRIMESPEECH_TEXT_DATA, PRIMESPEECH_G2PW ...
    out = phones_json(args.text, args.lang, version=args.version, llm=llm, data=data)
    print(json.dumps(out, ensure_ascii=False, indent=2))
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
    from . import settings
    from .cli_checks import check_say

    text = args.text if args.text != "-" else sys.stdin.read()
    overrides = _synthesis_overrides(args)
    # before anything heavy is imported or loaded
    spec, text = check_say(text, overrides, Path(args.output), args.voice, args.model_dir, args.catalog,
                           llm_text=settings.read("llm_text"))
    overrides["llm_text"] = False  # the LLM text stage ran in check_say, once

    import numpy as np

    from .engine import GPTSoVITSEngine

    engine = GPTSoVITSEngine(model_dir=args.model_dir, progress=lambda m: print(m, file=sys.stderr))
    engine.load_voice(spec)
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
    write_wav(args.output, audio, sr)
    dur = len(audio) / sr
    print(f"wrote {args.output}: {dur:.2f} s of audio in {elapsed:.2f} s (RTF {elapsed / max(dur, 1e-9):.2f})",
          file=sys.stderr)
    return 0


def write_wav(path: str, audio, sample_rate: int) -> None:
    """16-bit PCM in the format of the file's extension; a failure (disk full, file removed) as an OSError."""
    import soundfile as sf

    try:
        sf.write(path, audio, sample_rate, subtype="PCM_16")
    except sf.SoundFileError as exc:
        raise OSError(f"cannot write {path}: {exc}") from exc


def add_module_commands(sub) -> None:
    """The commands of MODULE_COMMANDS. One whose module cannot be imported (a missing extra, a broken install)
    stays listed, marked unavailable with the reason; running it reports that reason."""
    for module, command in MODULE_COMMANDS.items():
        try:
            mod = importlib.import_module(f"{__package__}.{module}")
        except Exception as exc:  # reported when the command is run: every other command keeps working
            add_unavailable(sub, command, module, exc)
            continue
        mod.add_parser(sub)


def add_unavailable(sub, command: str, module: str, exc: Exception) -> None:
    reason = f"{type(exc).__name__}: {exc}"
    s = sub.add_parser(command, help=f"(unavailable: {__package__}.{module} cannot be imported: {reason})")
    s.add_argument("rest", nargs=argparse.REMAINDER, help="the command's arguments (not read)")

    def unavailable(args) -> int:
        if isinstance(exc, ImportError):
            from .errors import PrimeSpeechError

            raise PrimeSpeechError(f"the {command} command is unavailable: {__package__}.{module} cannot be "
                                   f"imported ({reason})") from exc
        raise exc  # a bug in that module: its traceback

    s.set_defaults(func=unavailable)


def build_parser() -> argparse.ArgumentParser:
    from . import defaults as d

    p = argparse.ArgumentParser(prog="primespeech-mlx", description=DESCRIPTION, formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    add_global_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("say", help="speak a text into a WAV file")
    s.add_argument("text", help="text to speak ('-' reads standard input)")
    s.add_argument("--voice", default="Doubao", help="preset or user voice (primespeech-mlx voices lists them)")
    s.add_argument("-o", "--output", default="out.wav", help="WAV file to write")
    s.add_argument("--stream", action="store_true", help="use streaming synthesis (reports time to first audio)")
    s.add_argument("--lang", help=f"text language: {LANGS} (default: the voice's)")
    s.add_argument("--speed", dest="speed_factor", type=float, help="speech speed (default: the voice's speed_factor)")
    s.add_argument("--top-k", dest="top_k", type=int, help=f"GPT sampling: top-k (default: {d.TOP_K})")
    s.add_argument("--top-p", dest="top_p", type=float, help=f"GPT sampling: top-p (default: {d.TOP_P})")
    s.add_argument("--temperature", type=float, help=f"GPT sampling temperature (default: {d.TEMPERATURE})")
    s.add_argument("--repetition-penalty", dest="repetition_penalty", type=float,
                   help=f"GPT sampling: repetition penalty (default: {d.REPETITION_PENALTY})")
    s.add_argument("--seed", type=int, help=f"sampling seed, -1 for random (default: {d.SEED})")
    s.add_argument("--split", dest="text_split_method",
                   help=f"how the text is cut into sentences, cut0..cut5 (default: {d.TEXT_SPLIT_METHOD})")
    s.add_argument("--fragment-interval", dest="fragment_interval", type=float,
                   help=f"silence in seconds between sentences (default: {d.FRAGMENT_INTERVAL})")
    s.set_defaults(func=cmd_say)

    s = sub.add_parser("voices", help="list preset and user voices and whether they are installed")
    s.add_argument("--json", action="store_true", help="print the list as JSON")
    s.set_defaults(func=cmd_voices)

    s = sub.add_parser("download", help="download voices from Hugging Face and convert them (resumable)")
    s.add_argument(
        "voices", nargs="+", help="voice names, 'all', 'encoders', or 'sv' (the v2Pro speaker-verification model)"
    )
    s.add_argument("--no-convert", action="store_true", help="only download the original files")
    s.set_defaults(func=cmd_download)

    s = sub.add_parser("convert", help="convert a .ckpt/.pth/Hugging Face folder to the MLX format")
    s.add_argument("src", help="checkpoint file or model folder")
    s.add_argument("-o", "--output", help="output folder (default: <src>-mlx)")
    s.add_argument("--kind", choices=["gpt", "sovits", "hubert", "bert", "sv"],
                   help="what the source holds (default: detected from the source)")
    s.set_defaults(func=cmd_convert)

    s = sub.add_parser("dataflow", help="write the demo dataflow.yaml (TTS node, demo text source and WAV sink) "
                       "into a folder; `dora run dataflow.yaml` there speaks the demo texts into out/")
    s.add_argument("dir", nargs="?", default=".", help="folder to write dataflow.yaml into")
    s.add_argument("--force", action="store_true", help="overwrite an existing dataflow.yaml")
    s.set_defaults(func=cmd_dataflow)

    s = sub.add_parser("zenoh-overlay", help="print the path of the Zenoh overlay for dora 1.x "
                       "(DORA_ZENOH_CONFIG_OVERLAY / --zenoh-config-overlay: no dropped messages)")
    s.set_defaults(func=cmd_zenoh_overlay)

    s = sub.add_parser("phones", help="print the phonemes of a text as JSON (debugging voices); spoken_text and "
                       "norm_text show what is said after the LLM text stage")
    s.add_argument("text", help="text to convert")
    s.add_argument("--lang", default="zh", help=f"text language: {LANGS}")
    s.add_argument("--version", default="v2", choices=["v1", "v2"], help="symbol set of the model version")
    s.add_argument("--raw", action="store_true", help="skip the LLM text stage (as PRIMESPEECH_LLM_TEXT=false): "
                   "phonemise the text exactly as given")
    s.set_defaults(func=cmd_phones)

    add_module_commands(sub)
    for command in sub.choices.values():
        command.formatter_class = HelpFormatter
        add_global_options(command, top=False)
    return p


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a user's mistake or a missing/unwritable file, not a bug."""
    from .errors import PrimeSpeechError

    # ValueError covers the text front end's and checkpoint reading's errors (TextFrontendError, CheckpointError)
    return PrimeSpeechError, ValueError, OSError


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        resolve_places(args)
        return args.func(args)
    except KeyboardInterrupt:
        print("primespeech-mlx: interrupted", file=sys.stderr)
        return INTERRUPTED
    except user_errors() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
