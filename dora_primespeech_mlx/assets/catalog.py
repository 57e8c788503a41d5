"""Voices: the preset catalog, user-defined voices, and where their files are.

A voice is a GPT checkpoint, a SoVITS checkpoint, a reference clip (3-10 s) with its transcript
(``prompt_text``), a language and a speed factor, plus the two shared encoders (CNHubert, Chinese
RoBERTa). Presets are described by the YAML files in the repository's top-level ``voices/`` folder
(installed as package data) and live, once downloaded, in the old dora-primespeech layout::

    $PRIMESPEECH_MODEL_DIR/moyoyo/GPT_weights/*.ckpt
                                 /SoVITS_weights/*.pth
                                 /ref_audios/*.wav
                                 /chinese-hubert-base/  /chinese-roberta-wwm-ext-large/

so a model directory filled by the old node works unchanged. v2Pro / v2ProPlus voices (a SoVITS file of that
version) also need the speaker-verification model, ``moyoyo/sv/pretrained_eres2netv2w24s4ep4.ckpt`` (from
``lj1995/GPT-SoVITS``, fetched with the encoders when such a voice is installed). User voices are YAML files
with the same fields (plus an optional ``sv`` path), either ``$PRIMESPEECH_MODEL_DIR/voices/<Name>/voice.yaml``
or any ``*.yaml`` in ``$PRIMESPEECH_VOICES_DIR``; their paths are absolute or relative to the YAML file.
"""

from __future__ import annotations

import copy
import os
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import yaml

from ..errors import ConfigError, VoiceNotFoundError, VoiceNotInstalledError
from ..paths import expand, model_dir, originals_dir, request_path, user_voices_dir
from ..settings import read as read_setting
from ..text.language_segments import SUPPORTED_OPTIONS

DEFAULT_VOICE = "Doubao"
SUPPORTED_LANGS = SUPPORTED_OPTIONS  # zh en ja ko yue, their all_* forms, auto, auto_yue


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

    @property
    def needs_sv(self) -> bool:
        """Whether the SoVITS file is v2Pro-family (read cheaply from the file; False while it is missing)."""
        from ..convert.checkpoints import sovits_needs_sv

        return sovits_needs_sv(self.sovits)

    def missing_files(self) -> list[Path]:
        out = [p for p in (self.gpt, self.sovits, self.reference) if not p.exists()]
        out += [p for p in (self.hubert, self.bert) if not (p / "config.json").exists()]
        if self.source == "preset":  # downloaded files truncated/replaced since verified count as missing
            from .integrity import damaged

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


def _read_yaml(path: Path) -> dict:
    """The mapping in a voice file; parsed once per (path, mtime, size), so listing the voices (the node's
    ``list_voices``) costs a ``stat`` per file, not a YAML parse. Callers get their own copy."""
    try:
        st = os.stat(path)
        version = (st.st_mtime_ns, st.st_size)
        hit = _YAML_CACHE.get(str(path))
        if hit is not None and hit[0] == version:
            return copy.deepcopy(hit[1])
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read voice file ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a voice file must be a YAML mapping")
    if len(_YAML_CACHE) >= _YAML_CACHE_MAX:
        _YAML_CACHE.clear()
    _YAML_CACHE[str(path)] = (version, data)
    return copy.deepcopy(data)


@lru_cache(maxsize=1)
def encoder_info() -> EncoderInfo:
    d = _read_yaml(_catalog_dir() / "_encoders.yaml")
    return EncoderInfo(
        d["repository"], d["hubert"], d["bert"], tuple(d["hubert_files"]), tuple(d["bert_files"]),
        revision=str(d["revision"]) if d.get("revision") else None,
        sv=str(d.get("sv") or EncoderInfo.sv),
    )


def _check_fields(path: Path, d: dict, required: tuple[str, ...]) -> None:
    missing = [k for k in required if not d.get(k)]
    if missing:
        raise ConfigError(f"{path}: voice definition lacks {', '.join(missing)}")
    lang = str(d.get("language", ""))
    if lang not in SUPPORTED_LANGS:
        raise ConfigError(f"{path}: language {lang!r} is not supported (use one of {', '.join(SUPPORTED_LANGS)})")
    try:
        speed = float(d.get("speed_factor", 1.0))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: speed_factor must be a number") from None
    if not 0.25 <= speed <= 4.0:
        raise ConfigError(f"{path}: speed_factor {speed} is outside 0.25..4")


def _preset_from_yaml(path: Path, root: Path) -> VoiceSpec:
    d = _read_yaml(path)
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


def _user_from_yaml(path: Path, root: Path) -> VoiceSpec:
    """A user voice: own reference (+ optionally own weights; default: the Doubao weights)."""
    d = _read_yaml(path)
    _check_fields(path, d, ("name", "language", "reference"))

    def resolve(value) -> Path:
        p = expand(str(value))
        return p if p.is_absolute() else (path.parent / p).resolve()

    default = preset_voice(DEFAULT_VOICE, root)
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


def preset_names() -> list[str]:
    return [_read_yaml(p)["name"] for p in sorted(_catalog_dir().glob("*.yaml")) if not p.name.startswith("_")]


def preset_voice(name: str, root: Path | None = None) -> VoiceSpec:
    root = root or model_dir()
    for p in sorted(_catalog_dir().glob("*.yaml")):
        if not p.name.startswith("_") and _read_yaml(p).get("name") == name:
            return _preset_from_yaml(p, root)
    raise VoiceNotFoundError(f"unknown preset voice {name!r}; preset voices: {', '.join(sorted(preset_names()))}")


def _user_yaml_files(root: Path) -> list[Path]:
    files = sorted(user_voices_dir(root).glob("*/voice.yaml"))
    extra = read_setting("voices_dir")
    if extra:
        files += sorted(Path(extra).glob("*.yaml"))
    return files


def all_voices(root: Path | None = None) -> dict[str, VoiceSpec]:
    """Presets and user voices by name (a user voice of the same name overrides a preset)."""
    root = root or model_dir()
    out: dict[str, VoiceSpec] = {}
    for p in sorted(_catalog_dir().glob("*.yaml")):
        if not p.name.startswith("_"):
            spec = _preset_from_yaml(p, root)
            out[spec.name] = spec
    for p in _user_yaml_files(root):
        spec = _user_from_yaml(p, root)
        out[spec.name] = spec
    return out


def _match(name: str, names) -> str | None:
    """Exact name first (the old node's rule), then case/space-insensitive ("luo_xiang" -> "Luo Xiang")."""
    if name in names:
        return name

    def norm(s: str) -> str:
        return "".join(ch for ch in s.lower() if ch.isalnum())

    wanted = norm(name)
    hits = [n for n in names if norm(n) == wanted]
    return hits[0] if len(hits) == 1 else None


def resolve_voice(name: str, root: Path | None = None, require_installed: bool = True) -> VoiceSpec:
    """The voice called ``name``; :class:`VoiceNotFoundError` / :class:`VoiceNotInstalledError` otherwise."""
    root = root or model_dir()
    voices = all_voices(root)
    key = _match(str(name).strip(), voices)
    if key is None:
        raise VoiceNotFoundError(f"unknown voice {name!r}; known voices: {', '.join(sorted(voices))}")
    spec = voices[key]
    if require_installed:
        ensure_installed(spec, root)
    return spec


def ensure_installed(spec: VoiceSpec, root: Path | None = None) -> None:
    missing = spec.missing_files()
    if missing:
        raise VoiceNotInstalledError(not_installed_message(spec, missing, root))


def not_installed_message(spec: VoiceSpec, missing: list[Path], root: Path | None = None) -> str:
    """What every path that finds a voice incomplete says: the exact missing files and how to get them."""
    root = root or model_dir()
    listing = "\n  ".join(str(p) for p in missing)
    if spec.source == "preset":
        how = (
            f"Download it with:  primespeech-mlx download {spec.name!r}\n"
            f"(needs internet access to huggingface.co), or copy the files of the old dora-primespeech "
            f"node into {originals_dir(root)}, or set PRIMESPEECH_MODEL_DIR to a folder that has them."
        )
    else:
        how = "Fix the paths in the voice's YAML file, or download the shared encoders with " \
              "`primespeech-mlx download encoders` (v2Pro voices: also `primespeech-mlx download sv`)."
    return f"voice {spec.name!r} is not installed; missing:\n  {listing}\n{how}"


def list_voices(root: Path | None = None) -> list[VoiceInfo]:
    return [
        VoiceInfo(v.name, v.language, v.installed, v.source, v.speed_factor, v.description)
        for v in all_voices(root).values()
    ]


def custom_voice(
    reference: str | os.PathLike,
    prompt_text: str,
    language: str,
    gpt: str | os.PathLike | None = None,
    sovits: str | os.PathLike | None = None,
    base: VoiceSpec | str | None = None,
    root: Path | None = None,
    name: str | None = None,
    roots: tuple[Path, ...] | None = None,
) -> VoiceSpec:
    """A voice made on the fly: zero-shot cloning of ``reference`` with a base voice's weights
    (``VOICE:CUSTOM``), or with own weights (``VOICE:TRAINED``).

    The paths are taken literally (no ``~`` or ``$VAR``) and must be files inside ``roots`` (None: anywhere; the
    node passes ``PRIMESPEECH_REQUEST_PATHS``' folders): else :class:`RequestPathError`, the same for a missing
    file and a refused one (:func:`..paths.request_path`)."""
    root = root or model_dir()
    if isinstance(base, VoiceSpec):
        base_spec = base
    else:
        base_spec = resolve_voice(base or DEFAULT_VOICE, root, require_installed=False)
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
