"""The node's dora 1.x manifest (``dora-node.yml``): typed ports, the contract settings with their types and defaults
(read off :mod:`.settings`' table), an example. The checkout's ``dora-node.yml`` (beside ``pyproject.toml``) and the
wheel's copy (``dora_primespeech_mlx/dora-node.yml``) are this module's output, written by
``python -m dora_primespeech_mlx.manifest --write`` and checked by ``tests/test_manifest.py``;
``dora validate --node-manifest dora-node.yml`` checks it against dora's schema (``.ci/run``)."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from . import settings as settings_mod
from .dataflow.params import PARAMETERS

NAMESPACE = "primespeech"  # the index namespace (a GitHub org/user when published); shipped types live under it
AUDIO_TYPE = f"{NAMESPACE}/tts/v1/Audio"
STRING = "std/core/v1/String"
PACKAGED = Path(__file__).resolve().with_name("dora-node.yml")  # the wheel's copy
CHECKOUT = Path(__file__).resolve().parents[1] / "dora-node.yml"  # beside pyproject.toml

INPUTS = {
    "text": (STRING, True, "Text to speak: plain text, a JSON object ({\"prompt\", \"language\", \"speed\", ...}) or "
                           "a `VOICE:NAME|text` prefix; UTF-8 bytes (UInt8) are read too. One segment_complete "
                           "per text (per utterance of a segment_id/seq/fin token stream)."),
    "control": (STRING, False, "Commands answered on `status`: reset, stats, list_voices, change_voice:NAME, "
                               "cleanup; `flush: true` in the metadata barges in."),
    "reset": (None, False, "Any value: cancels every text sent before it (same as the `reset` control)."),
}
OUTPUTS = {
    "audio": (AUDIO_TYPE, "Float32 samples at 32 kHz, mono, one message per text (or per chunk with STREAMING); "
                          "metadata sample_rate, duration, voice, language, chunk_index, is_final."),
    "segment_complete": (STRING, "[\"completed\"], [\"skipped\"] or [\"error\"], once per text; a skipped or failed "
                                 "text carries `reason` (and `error`, `error_stage`) in its metadata."),
    "status": (STRING, "One JSON object per message: ready, synthesizing then done/skipped/error per text, the "
                       "control and parameter answers."),
    "log": (STRING, "One JSON object per message: node, level, message, timestamp (filtered by LOG_LEVEL)."),
}
AUDIO_METADATA = {
    "sample_rate": "samples per second (int, 32000)",
    "duration": "seconds of audio in this message (float)",
    "voice": "the voice that spoke it",
    "language": "the language it was read as",
    "chunk_index": "0-based chunk number within the text",
    "is_final": "the text's last chunk",
}
EXAMPLE = """\
- id: primespeech
  path: dora-primespeech-mlx
  inputs:
    text: llm/text
    control: ui/control
  outputs:
    - audio
    - segment_complete
    - status
    - log
  env:
    VOICE_NAME: Doubao
    STREAMING: "false"
"""
HEADER = """\
# dora-node.yml: the dora 1.x node manifest of dora-primespeech-mlx (`dora validate --node-manifest dora-node.yml`).
# Generated from dora_primespeech_mlx/settings.py and manifest.py: python -m dora_primespeech_mlx.manifest --write
# Runtime parameters (`dora param set NODE KEY VALUE`, listed by `dora param list NODE`):
#   {params}.
"""


def env_type(annotation: str) -> str:
    """The manifest's env type (string | int | float | bool) of a Settings field's annotation."""
    first = str(annotation).split("|")[0].strip()
    kinds = {part.strip() for part in str(annotation).split("|")} - {"None"}
    if len(kinds) == 1 and first in ("bool", "int", "float"):
        return first
    return "string"


def _default(var: settings_mod.Var) -> Any:
    shown = {"model_dir": settings_mod.DEFAULT_MODEL_DIR}
    value = shown.get(var.field, var.default)
    if isinstance(value, Path):
        return str(value)
    return value


def env_entries(audience: str = "contract") -> dict[str, dict[str, Any]]:
    """``{NAME: {type, default, description}}`` for every setting of ``audience`` (no default: unset), aliases
    named in the description."""
    annotations = {f.name: f.type for f in fields(settings_mod.Settings)}
    out: dict[str, dict[str, Any]] = {}
    for var in settings_mod.VARS:
        if var.audience != audience:
            continue
        entry: dict[str, Any] = {"type": env_type(annotations[var.field])}
        default = _default(var)
        if default is not None:
            entry["default"] = default
        alias = f" (aliases: {', '.join(var.aliases)})" if var.aliases else ""
        entry["description"] = var.meaning + alias
        out[var.name] = entry
    return out


def manifest() -> dict[str, Any]:
    """The manifest as a mapping (``apiVersion: 1``)."""
    inputs = {}
    for name, (urn, required, text) in INPUTS.items():
        port: dict[str, Any] = {} if urn is None else {"type": urn}
        port.update(required=required, description=text)
        inputs[name] = port
    return {
        "apiVersion": 1,
        "name": "dora-primespeech-mlx",
        "namespace": NAMESPACE,
        "description": "GPT-SoVITS v2 text-to-speech on MLX (no PyTorch): streaming, barge-in, one answer per text",
        "categories": ["speech", "ml-inference"],
        "keywords": ["tts", "text-to-speech", "gpt-sovits", "mlx", "voice-cloning", "streaming"],
        "runtime": "python",
        "entrypoint": "dora-primespeech-mlx",
        "build": "pip install .",
        "platforms": ["linux-x86_64", "linux-aarch64", "macos-aarch64"],
        "inputs": inputs,
        "outputs": {name: {"type": urn, "description": text} for name, (urn, text) in OUTPUTS.items()},
        "env": env_entries(),
        "types": {AUDIO_TYPE: {
            "arrow": "Float32",
            "description": "Mono float32 samples at 32 kHz. AUDIO_FORMAT=list (the default, what the old "
                           "dora-primespeech players read) wraps them in a ListArray of length 1 "
                           "(pa.array([samples])); AUDIO_FORMAT=flat sends the Float32Array itself.",
            "metadata": [{"key": k, "description": v} for k, v in AUDIO_METADATA.items()],
        }},
        "example": EXAMPLE,
    }


def manifest_text() -> str:
    body = yaml.safe_dump(manifest(), sort_keys=False, allow_unicode=True, width=120, default_flow_style=False)
    return HEADER.format(params=", ".join(PARAMETERS)) + body


def main(argv: list[str] | None = None) -> int:
    """``--write``: write both copies; else print the manifest."""
    argv = sys.argv[1:] if argv is None else argv
    text = manifest_text()
    if "--write" in argv:
        paths = [PACKAGED] + ([CHECKOUT] if (CHECKOUT.parent / "pyproject.toml").is_file() else [])
        for path in paths:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
