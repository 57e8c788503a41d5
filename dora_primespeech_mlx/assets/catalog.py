"""Voices: the preset catalog, user-defined voices, and where their files are.

A voice is a GPT checkpoint, a SoVITS checkpoint, a reference clip (3-10 s) with its transcript
(``prompt_text``), a language and a speed factor, plus the two shared encoders (CNHubert, Chinese
RoBERTa); v2Pro / v2ProPlus voices also need the speaker-verification model. Presets are described by the YAML
files in the repository's top-level ``voices/`` folder (installed as package data) and live, once downloaded, in
the old dora-primespeech layout under ``$PRIMESPEECH_MODEL_DIR/moyoyo/``, so a model directory filled by the old
node works unchanged; user voices are YAML files with the same fields (:func:`_user_yaml_files`). The layout and
the fields: docs/voices.md. A voice file that fails is listed as broken with its reason (:func:`broken_voices`)
and never stops the other voices; every transcript is bounded by :data:`MAX_PROMPT_CHARS`."""

from __future__ import annotations

import copy
import difflib
import logging
import os
import shlex
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from ..convert.checkpoints import sovits_needs_sv
from ..errors import ConfigError, VoiceNotFoundError, VoiceNotInstalledError
from ..paths import DEFAULT_MODEL_DIR, expand, originals_dir, request_path, user_voices_dir
from ..text.language_segments import SUPPORTED_OPTIONS
from . import voicefile
from .integrity import damaged

log = logging.getLogger(__name__)

DEFAULT_VOICE = "Doubao"
SUPPORTED_LANGS = SUPPORTED_OPTIONS  # zh en ja ko yue, their all_* forms, auto, auto_yue
MAX_PROMPT_CHARS = 500  # a 3-10 s reference's transcript is well under 200; its cost grows with its square


def check_prompt_text(prompt_text: str, where: str = "prompt_text") -> None:
    """Refuse a reference transcript over :data:`MAX_PROMPT_CHARS` characters (ConfigError naming the limit):
    the prompt is turned into phones, BERT features and GPT context whose memory grows with its square."""
    if len(prompt_text) > MAX_PROMPT_CHARS:
        raise ConfigError(f"{where}: the reference transcript has {len(prompt_text)} characters; the limit is "
                          f"{MAX_PROMPT_CHARS} (MAX_PROMPT_CHARS; a 3-10 s reference's transcript is far shorter)")


def _catalog_dir() -> Path:
    """The preset YAML folder: the checkout's top-level ``voices/`` (editable install) or the wheel's copy,
    ``dora_primespeech_mlx/assets/presets``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "presets", here.parents[1] / "voices"):
        if (candidate / "_encoders.yaml").is_file():
            return candidate
    looked = f"{here / 'presets'}, {here.parents[1] / 'voices'}"
    raise ConfigError(f"the preset voice catalog is missing (looked in {looked})")


@dataclass(frozen=True)
class VoiceSpec:
    """Everything needed to speak with one voice; all paths are absolute."""

    name: str
    language: str
    prompt_text: str
    prompt_lang: str
    speed_factor: float
    gpt: Path
    sovits: Path
    reference: Path
    hubert: Path
    bert: Path
    source: str = "preset"  # preset | user | custom
    description: str = ""
    repository: str | None = None  # Hugging Face repo of gpt/sovits/reference (presets)
    files: tuple[str, ...] = ()  # their paths inside that repo
    revision: str | None = None  # pinned commit of that repo (None: the one recorded by the first download)
    sv: Path | None = None  # speaker-verification model, used only when the SoVITS is v2Pro / v2ProPlus

    def __post_init__(self):
        """Every voice, however made (catalog, message, Python API, ``dataclasses.replace``), has a bounded
        transcript before any work is spent on it."""
        if self.prompt_text is None:  # no prompt: reference-free mode, like ""
            return
        if not isinstance(self.prompt_text, str):
            raise ConfigError(f"voice {self.name!r}: prompt_text must be text, not {type(self.prompt_text).__name__}")
        check_prompt_text(self.prompt_text, f"voice {str(self.name)[:80]!r}")

    @property
    def needs_sv(self) -> bool:
        """Whether the SoVITS file is v2Pro-family (read cheaply from the file; False while it is missing)."""
        return sovits_needs_sv(self.sovits)

    def missing_files(self) -> list[Path]:
        out = [p for p in (self.gpt, self.sovits, self.reference) if not p.exists()]
        out += [p for p in (self.hubert, self.bert) if not (p / "config.json").exists()]
        if self.source == "preset":  # downloaded files truncated/replaced since verified count as missing
            out += [p for p in damaged(self.hubert.parent, (self.gpt, self.sovits, self.reference, self.hubert,
                                                            self.bert)) if p not in out]
        if self.sovits.exists() and self.needs_sv and (self.sv is None or not Path(self.sv).exists()):
            out.append(Path(self.sv) if self.sv is not None else Path("<speaker-verification model (sv)>"))
        return out

    @property
    def installed(self) -> bool:
        return not self.missing_files()

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    language: str
    installed: bool
    source: str
    speed_factor: float
    description: str = ""
    error: str = ""  # a broken voice file: why it cannot be used (the other fields are what could be read)


@dataclass(frozen=True)
class BrokenVoice:
    """A voice file that cannot be used, and why; listed, never in the way of the other voices."""

    path: Path
    name: str  # its ``name`` when readable, else its folder's (``voices/<Name>/voice.yaml``) or file's stem
    source: str  # preset | user
    error: str


@dataclass(frozen=True)
class EncoderInfo:
    repository: str
    hubert: str
    bert: str
    hubert_files: tuple[str, ...]
    bert_files: tuple[str, ...]
    revision: str | None = None  # pinned commit of the repo (None: the one recorded by the first download)
    sv: str = "sv/pretrained_eres2netv2w24s4ep4.ckpt"  # v2Pro voices' speaker-verification model (same repo)


_YAML_CACHE: dict[str, tuple[tuple[int, int], dict]] = {}  # path -> ((mtime_ns, size), parsed mapping)
_YAML_CACHE_MAX = 512


def _read_yaml(path: Path, known: tuple[str, ...] = voicefile.VOICE_KEYS, unknown_keys: str = "error") -> dict:
    """The mapping in a voice file, read like a config file (:mod:`.voicefile`: size, aliases, key count and
    unknown keys checked: an error, or a warning with ``unknown_keys="warn"``); parsed once per (path, mtime,
    size), so listing the voices (the node's ``list_voices``) costs a ``stat`` per file, not a YAML parse. Callers
    get their own copy."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read voice file ({exc.strerror or exc})") from None
    version = (st.st_mtime_ns, st.st_size)
    hit = _YAML_CACHE.get(str(path))
    if hit is not None and hit[0] == version:
        data = hit[1]
    else:
        data = voicefile.parse(path, voicefile.read_bounded(path))
        if len(_YAML_CACHE) >= _YAML_CACHE_MAX:
            _YAML_CACHE.clear()
        _YAML_CACHE[str(path)] = (version, data)
    voicefile.check_keys(path, data, known, unknown_keys)
    return copy.deepcopy(data)


@lru_cache(maxsize=1)
def encoder_info() -> EncoderInfo:
    d = _read_yaml(_catalog_dir() / "_encoders.yaml", voicefile.ENCODER_KEYS)
    return EncoderInfo(
        d["repository"], d["hubert"], d["bert"], tuple(d["hubert_files"]), tuple(d["bert_files"]),
        revision=str(d["revision"]) if d.get("revision") else None,
        sv=str(d.get("sv") or EncoderInfo.sv),
    )


def _check_fields(path: Path, d: dict, required: tuple[str, ...]) -> None:
    nested = [str(k) for k, v in d.items() if isinstance(v, (dict, list))]
    if nested:
        raise ConfigError(f"{path}: {', '.join(nested)} must be a single value, not a list or mapping")
    missing = [k for k in required if not d.get(k)]
    if missing:
        raise ConfigError(f"{path}: voice definition lacks {', '.join(missing)}")
    if d.get("prompt_text") is not None:
        check_prompt_text(str(d["prompt_text"]), f"{path}: prompt_text")
    lang = str(d.get("language", ""))
    if lang not in SUPPORTED_LANGS:
        raise ConfigError(f"{path}: language {lang!r} is not supported (use one of {', '.join(SUPPORTED_LANGS)})")
    try:
        speed = float(d.get("speed_factor", 1.0))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: speed_factor must be a number") from None
    if not 0.25 <= speed <= 4.0:
        raise ConfigError(f"{path}: speed_factor {speed} is outside 0.25..4")


def _preset_from_yaml(path: Path, root: Path, unknown_keys: str) -> VoiceSpec:
    d = _read_yaml(path, unknown_keys=unknown_keys)
    _check_fields(path, d, ("name", "language", "gpt", "sovits", "reference", "repository"))
    base = originals_dir(root)
    enc = encoder_info()
    return VoiceSpec(
        **_described(d),
        gpt=base / d["gpt"],
        sovits=base / d["sovits"],
        reference=base / d["reference"],
        hubert=base / enc.hubert,
        bert=base / enc.bert,
        source="preset",
        description=str(d.get("description") or ""),
        repository=str(d["repository"]),
        files=(str(d["gpt"]), str(d["sovits"]), str(d["reference"])),
        revision=str(d["revision"]) if d.get("revision") else None,
        sv=base / enc.sv,
    )


def _described(d: dict) -> dict:
    """The fields every voice YAML gives the same way: name, language, prompt and speed."""
    return {"name": str(d["name"]), "language": str(d["language"]),
            "prompt_text": str(d.get("prompt_text") or ""), "prompt_lang": str(d.get("prompt_lang") or d["language"]),
            "speed_factor": float(d.get("speed_factor", 1.0))}


def _user_from_yaml(path: Path, root: Path, unknown_keys: str) -> VoiceSpec:
    """A user voice: own reference (+ optionally own weights; default: the Doubao weights)."""
    d = _read_yaml(path, unknown_keys=unknown_keys)
    _check_fields(path, d, ("name", "language", "reference"))

    def resolve(value) -> Path:
        p = expand(str(value))
        return p if p.is_absolute() else (path.parent / p).resolve()

    default = preset_voice(DEFAULT_VOICE, root, unknown_keys=unknown_keys)
    return VoiceSpec(
        **_described(d),
        gpt=resolve(d["gpt"]) if d.get("gpt") else default.gpt,
        sovits=resolve(d["sovits"]) if d.get("sovits") else default.sovits,
        reference=resolve(d["reference"]),
        hubert=resolve(d["hubert"]) if d.get("hubert") else default.hubert,
        bert=resolve(d["bert"]) if d.get("bert") else default.bert,
        source="user",
        description=str(d.get("description") or ""),
        sv=resolve(d["sv"]) if d.get("sv") else default.sv,
    )


def _preset_files() -> list[Path]:
    return [p for p in sorted(_catalog_dir().glob("*.yaml")) if not p.name.startswith("_")]


def _guess_name(path: Path) -> str:
    """What a broken voice file is called: its ``name`` when that much can be read, else its folder's name
    (``voices/<Name>/voice.yaml``) or its file's stem."""
    hit = _YAML_CACHE.get(str(path))
    if hit is not None and isinstance(hit[1].get("name"), str) and hit[1]["name"].strip():
        return hit[1]["name"][:200]
    return path.parent.name if path.name == "voice.yaml" else path.stem


_WARNED: set[str] = set()


def _scan(root: Path, voices_dir: Path | None, unknown_keys: str) -> tuple[dict[str, VoiceSpec], list[BrokenVoice]]:
    """Every voice file read once: the usable voices by name (a user voice of the same name overrides a preset)
    and the broken files with their reasons. One broken file never hides the others."""
    out: dict[str, VoiceSpec] = {}
    broken: list[BrokenVoice] = []
    files = [(p, "preset", _preset_from_yaml) for p in _preset_files()]
    files += [(p, "user", _user_from_yaml) for p in _user_yaml_files(root, voices_dir)]
    for path, source, build in files:
        try:
            spec = build(path, root, unknown_keys)
        except ConfigError as exc:
            broken.append(BrokenVoice(path, _guess_name(path), source, str(exc)))
            continue
        out[spec.name] = spec
    for b in broken:
        if b.error not in _WARNED:  # once per reason, not at every lookup
            if len(_WARNED) >= _YAML_CACHE_MAX:
                _WARNED.clear()
            _WARNED.add(b.error)
            log.warning("voice file skipped: %s", b.error)
    return out, broken


def preset_names() -> list[str]:
    """The names of the usable preset voices."""
    names = []
    for p in _preset_files():
        try:
            names.append(str(_read_yaml(p)["name"]))
        except (ConfigError, KeyError):
            continue
    return names


def preset_voice(name: str, root: Path, *, unknown_keys: str = "error") -> VoiceSpec:
    """The preset called ``name`` (exactly), its files inside the model directory ``root``."""
    for p in _preset_files():
        try:
            found = _read_yaml(p).get("name") == name
        except ConfigError:
            continue
        if found:
            return _preset_from_yaml(p, root, unknown_keys)
    raise VoiceNotFoundError(f"unknown preset voice {name!r}; preset voices: {', '.join(sorted(preset_names()))}")


def _user_yaml_files(root: Path, voices_dir: Path | None) -> list[Path]:
    """``<root>/voices/<Name>/voice.yaml``, then every ``*.yaml`` in ``voices_dir`` (``PRIMESPEECH_VOICES_DIR``). Their
    fields are a preset's (plus an optional ``sv`` path); their paths are absolute or relative to the YAML file."""
    files = sorted(user_voices_dir(root).glob("*/voice.yaml"))
    if voices_dir:
        files += sorted(Path(voices_dir).glob("*.yaml"))
    return files


def all_voices(root: Path, *, voices_dir: Path | None = None, unknown_keys: str = "error") -> dict[str, VoiceSpec]:
    """Presets and user voices by name (a user voice of the same name overrides a preset); broken voice files
    are left out (:func:`broken_voices` lists them). ``root`` is the model directory, ``voices_dir`` the extra
    folder of user voice files and ``unknown_keys`` (``error`` | ``warn``) what an unknown key in a voice file
    is: the settings ``PRIMESPEECH_MODEL_DIR``, ``PRIMESPEECH_VOICES_DIR`` and ``PRIMESPEECH_VOICE_UNKNOWN_KEYS``,
    which the entry points (CLI, node, engine) pass; the other lookups here take the same three."""
    return _scan(root, voices_dir, unknown_keys)[0]


def broken_voices(root: Path, *, voices_dir: Path | None = None, unknown_keys: str = "error") -> list[BrokenVoice]:
    """The voice files that cannot be used, each with its reason."""
    return _scan(root, voices_dir, unknown_keys)[1]


def catalog_options(settings) -> dict:
    """The keywords of the lookups here that come from the settings (``voices_dir``, ``unknown_keys``), for the
    entry points that hold a :class:`~..settings.Settings`: ``resolve_voice(name, root, **catalog_options(s))``."""
    return {"voices_dir": settings.voices_dir, "unknown_keys": settings.voice_unknown_keys}


def _match(name: str, names) -> str | None:
    """Exact name first (the old node's rule), then case/space-insensitive ("luo_xiang" -> "Luo Xiang")."""
    if name in names:
        return name

    def norm(s: str) -> str:
        return "".join(ch for ch in s.lower() if ch.isalnum())

    wanted = norm(name)
    hits = [n for n in names if norm(n) == wanted]
    return hits[0] if len(hits) == 1 else None


def did_you_mean(name: str, names) -> str | None:
    """The known voice name closest to a mistyped ``name`` ("Tinny" -> "Tiny", "luo xaing" -> "Luo Xiang"), compared
    without case, spaces and punctuation; None when none is close."""

    def norm(s: str) -> str:
        return "".join(ch for ch in s.lower() if ch.isalnum())

    by_norm = {norm(n): n for n in names}
    close = difflib.get_close_matches(norm(name), list(by_norm), n=1, cutoff=0.75)
    return by_norm[close[0]] if close else None


def resolve_voice(name: str, root: Path, require_installed: bool = True, *, voices_dir: Path | None = None,
                  unknown_keys: str = "error") -> VoiceSpec:
    """The voice called ``name``; :class:`VoiceNotFoundError` / :class:`VoiceNotInstalledError` otherwise, and
    the file's own :class:`ConfigError` when ``name`` is a broken voice file's."""
    voices, broken = _scan(root, voices_dir, unknown_keys)
    key = _match(str(name).strip(), voices)
    if key is None:
        by_name = {b.name: b for b in broken}
        hit = _match(str(name).strip(), by_name)
        if hit is not None:
            raise ConfigError(f"voice {name!r} cannot be used: {by_name[hit].error}")
        note = f" (broken voice files: {', '.join(str(b.path) for b in broken)})" if broken else ""
        guess = did_you_mean(str(name).strip(), voices)
        hint = f" (did you mean {guess!r}?)" if guess else ""
        raise VoiceNotFoundError(f"unknown voice {name!r}{hint}; known voices: {', '.join(sorted(voices))}{note}")
    spec = voices[key]
    if require_installed:
        ensure_installed(spec, root)
    return spec


def ensure_installed(spec: VoiceSpec, root: Path) -> None:
    """:class:`VoiceNotInstalledError` listing the files of ``spec`` that are missing (``root``: the model
    directory, named in the message)."""
    missing = spec.missing_files()
    if missing:
        raise VoiceNotInstalledError(not_installed_message(spec, missing, root))


def not_installed_message(spec: VoiceSpec, missing: list[Path], root: Path, offline: bool = False) -> str:
    """What every path that finds a voice incomplete says, for a terminal: a headline, the exact missing files, the
    other ways to get them, and last the one command that fixes it. ``offline``: the download itself could not
    reach the Hub, so the command to run here is not a download."""
    listing = "\n  ".join(str(p) for p in missing)
    head = f"voice {spec.name!r} is not installed; missing:\n  {listing}\n"
    if spec.source != "preset":
        return head + ("Fix the paths in the voice's YAML file, or download the shared encoders with "
                       "`primespeech-mlx download encoders` (v2Pro voices: also `primespeech-mlx download sv`).")
    command = download_command(spec.name, root)
    if offline:
        return head + (
            f"This machine cannot reach huggingface.co: copy the files of the old dora-primespeech node into "
            f"{originals_dir(root)}, or set PRIMESPEECH_MODEL_DIR to a folder that has them, or run this on a "
            f"machine with internet access and copy the {originals_dir(root).name} folder it fills into "
            f"{originals_dir(root)} here:\n  {command}")
    return head + (
        f"Or copy the files of the old dora-primespeech node into {originals_dir(root)}, or set "
        "PRIMESPEECH_MODEL_DIR to a folder that has them.\n"
        f"Fix (needs internet access to huggingface.co):\n  {command}")


def download_command(name: str, root: Path) -> str:
    """The command that downloads preset ``name`` into the model directory ``root`` (``--model-dir`` unless it is
    the default one)."""
    where = "" if Path(root).expanduser() == expand(DEFAULT_MODEL_DIR) else f" --model-dir {shlex.quote(str(root))}"
    quoted = "'" + name.replace("'", "'\"'\"'") + "'"  # always quoted, as the shell reads it
    return f"primespeech-mlx download {quoted}{where}"


def list_voices(root: Path, *, voices_dir: Path | None = None, unknown_keys: str = "error") -> list[VoiceInfo]:
    """Every voice, usable ones first, then the broken files (``error`` says why; not installed)."""
    voices, broken = _scan(root, voices_dir, unknown_keys)
    return [
        VoiceInfo(v.name, v.language, v.installed, v.source, v.speed_factor, v.description)
        for v in voices.values()
    ] + [VoiceInfo(b.name, "", False, b.source, 0.0, "", error=b.error) for b in broken]


def custom_voice(
    reference: str | os.PathLike,
    prompt_text: str,
    language: str,
    *,
    root: Path,
    gpt: str | os.PathLike | None = None,
    sovits: str | os.PathLike | None = None,
    base: VoiceSpec | str | None = None,
    name: str | None = None,
    roots: tuple[Path, ...] | None = None,
    voices_dir: Path | None = None,
    unknown_keys: str = "error",
) -> VoiceSpec:
    """A voice made on the fly: zero-shot cloning of ``reference`` with a base voice's weights
    (``VOICE:CUSTOM``), or with own weights (``VOICE:TRAINED``).

    The paths are taken literally (no ``~`` or ``$VAR``) and must be files inside ``roots`` (None: anywhere; the
    node passes ``PRIMESPEECH_REQUEST_PATHS``' folders): else :class:`RequestPathError`, the same for a missing
    file and a refused one (:func:`..paths.request_path`)."""
    check_prompt_text(prompt_text if isinstance(prompt_text, str) else str(prompt_text), "prompt_text of the request")
    if isinstance(base, VoiceSpec):
        base_spec = base
    else:
        base_spec = resolve_voice(base or DEFAULT_VOICE, root, require_installed=False, voices_dir=voices_dir,
                                  unknown_keys=unknown_keys)
    # The old node's rule: a known language passes, anything else becomes auto.
    lang = language if language in SUPPORTED_LANGS else "auto"
    ref = request_path(reference, roots, "reference audio")
    own_gpt = request_path(gpt, roots, "GPT checkpoint") if gpt else None
    own_sovits = request_path(sovits, roots, "SoVITS checkpoint") if sovits else None
    spec = replace(
        base_spec,
        name=name or ("TRAINED" if gpt or sovits else "CUSTOM"),
        language=lang,
        prompt_lang=lang,
        prompt_text=prompt_text,
        reference=ref,
        gpt=own_gpt or base_spec.gpt,
        sovits=own_sovits or base_spec.sovits,
        source="custom",
        repository=None,
        files=(),
    )
    if gpt or sovits:
        spec = replace(spec, speed_factor=1.1)
    ensure_installed(spec, root)
    return spec
