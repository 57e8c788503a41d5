"""Read the original GPT-SoVITS checkpoint files and Hugging Face model folders, torch-free.

Each reader returns a :class:`RawCheckpoint`: the tensors as numpy arrays under their original names,
the model config as a plain dict, and the detected model version. Key mapping, weight-norm folding and
layout changes are the business of each model's ``sanitize``; this module only knows file formats.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .torch_pickle import VERSION_TAGS, CheckpointError, HParams, load_torch_file, read_header

SUPPORTED_VERSIONS = ("v1", "v2")


@dataclass
class RawCheckpoint:
    path: Path
    kind: str  # "gpt" | "sovits" | "hubert" | "bert"
    weights: dict[str, np.ndarray]
    config: dict[str, Any]
    version: str = "v2"
    info: dict[str, Any] = field(default_factory=dict)


def _plain(obj: Any) -> Any:
    """HParams / OrderedDict / numpy scalars -> plain JSON-able Python objects."""
    if isinstance(obj, (dict, HParams)):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _tensor_dict(path: Path, obj: Any, what: str) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict):
        raise CheckpointError(path, f"{what} is a {type(obj).__name__}, expected a dict of tensors")
    out = {}
    for k, v in obj.items():
        if isinstance(v, np.ndarray):
            out[str(k)] = v
    if not out:
        raise CheckpointError(path, f"{what} holds no tensors")
    return out


def _unsupported(path: Path, version: str) -> CheckpointError:
    return CheckpointError(
        path,
        f"GPT-SoVITS {version} models are not supported yet (supported: {', '.join(SUPPORTED_VERSIONS)})",
    )


def read_gpt(path: str | os.PathLike) -> RawCheckpoint:
    """Read a GPT (text-to-semantic, "s1") ``.ckpt``: ``{"weight": ..., "config": ..., "info": ...}``."""
    path = Path(path)
    obj = load_torch_file(path)
    if not isinstance(obj, dict) or "weight" not in obj:
        keys = list(obj)[:5] if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(path, f"not a GPT-SoVITS GPT checkpoint (top-level keys: {keys})")
    weights = _tensor_dict(path, obj["weight"], "'weight'")
    if "model.ar_text_embedding.word_embeddings.weight" not in weights:
        if any(k.startswith(("enc_p.", "dec.")) for k in weights):
            raise CheckpointError(path, "this is a SoVITS (.pth) checkpoint, not a GPT (.ckpt)")
        raise CheckpointError(path, "not a GPT-SoVITS GPT checkpoint (no model.ar_text_embedding)")
    config = _plain(obj.get("config") or {})
    if "model" not in config:
        raise CheckpointError(path, "GPT checkpoint has no config['model'] section")
    n_sym = weights["model.ar_text_embedding.word_embeddings.weight"].shape[0]
    version = "v1" if n_sym == 512 or config["model"].get("phoneme_vocab_size") == 512 else "v2"
    return RawCheckpoint(path, "gpt", weights, config, version, {"info": _plain(obj.get("info"))})


def sovits_version(path: Path, weights: dict[str, np.ndarray], header: bytes) -> str:
    """The SoVITS model version from the 2-byte tag and the weights (upstream's rules, section 7.4)."""
    tagged = VERSION_TAGS.get(header)
    if tagged and tagged not in SUPPORTED_VERSIONS:
        raise _unsupported(path, tagged)
    if any(k.startswith(("sv_emb.", "ge_to512.")) for k in weights):
        raise _unsupported(path, "v2Pro")
    if any(k.startswith("cfm.") for k in weights):
        raise _unsupported(path, "v3/v4")
    if "enc_p.text_embedding.weight" not in weights:
        raise CheckpointError(path, "not a GPT-SoVITS SoVITS checkpoint (no enc_p.text_embedding)")
    n_sym = weights["enc_p.text_embedding.weight"].shape[0]
    return "v1" if n_sym == 322 else "v2"


def read_sovits(path: str | os.PathLike) -> RawCheckpoint:
    """Read a SoVITS generator ``.pth`` (plain zip or with a 2-byte version tag; HParams config)."""
    path = Path(path)
    header = read_header(path) if path.is_file() else b""
    obj = load_torch_file(path)
    if not isinstance(obj, dict) or "weight" not in obj:
        keys = list(obj)[:5] if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(path, f"not a GPT-SoVITS SoVITS checkpoint (top-level keys: {keys})")
    weights = _tensor_dict(path, obj["weight"], "'weight'")
    if any(k.startswith("model.ar_") for k in weights):
        raise CheckpointError(path, "this is a GPT (.ckpt) checkpoint, not a SoVITS (.pth)")
    if "lora_rank" in obj:
        raise _unsupported(path, "v3/v4 LoRA")
    version = sovits_version(path, weights, header)
    config = _plain(obj.get("config") or {})
    if "model" not in config or "data" not in config:
        raise CheckpointError(path, "SoVITS checkpoint has no config['model'] / config['data'] section")
    return RawCheckpoint(path, "sovits", weights, config, version, {"info": _plain(obj.get("info"))})


def read_hf_dir(path: str | os.PathLike, kind: str) -> RawCheckpoint:
    """Read a Hugging Face model folder: ``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(path, f"{kind} model folder not found")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(path, "config.json is missing")
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(cfg_file, f"invalid JSON ({exc})") from None
    st = path / "model.safetensors"
    if st.is_file():
        from safetensors.numpy import load_file

        try:
            weights = load_file(str(st))
        except Exception as exc:
            raise CheckpointError(st, f"corrupt safetensors file ({exc})") from None
    else:
        bin_file = path / "pytorch_model.bin"
        if not bin_file.is_file():
            raise CheckpointError(path, "neither model.safetensors nor pytorch_model.bin is present")
        weights = _tensor_dict(bin_file, load_torch_file(bin_file), "pytorch_model.bin")
    expected = {"hubert": "hubert", "bert": "bert"}.get(kind)
    model_type = str(config.get("model_type", ""))
    if expected and model_type and model_type != expected:
        raise CheckpointError(path, f"expected a {expected} model, config.json says model_type={model_type!r}")
    return RawCheckpoint(path, kind, weights, config, "v2")
