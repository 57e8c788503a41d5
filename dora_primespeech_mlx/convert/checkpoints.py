"""Read the original GPT-SoVITS checkpoint files and Hugging Face model folders, torch-free.

Each reader returns a :class:`RawCheckpoint`: the tensors as numpy arrays under their original names,
the model config as a plain dict, and the detected model version. Key mapping, weight-norm folding and
layout changes are the business of each model's ``sanitize``; this module only knows file formats.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .torch_pickle import VERSION_TAGS, CheckpointError, HParams, load_torch_file, pickle_bytes, read_header

SUPPORTED_VERSIONS = ("v1", "v2", "v2Pro", "v2ProPlus")
V2PRO_VERSIONS = ("v2Pro", "v2ProPlus")  # SoVITS conditioned on a speaker-verification embedding too

# MD5 of the first 8 KiB of the official pretrained SoVITS files -> model version (upstream
# process_ckpt.hash_pretrained_dict): these are recognised whatever their first two bytes are.
PRETRAINED_MD5 = {
    "dc3c97e17592963677a4a1681f30c653": "v2",
    "6642b37f3dbb1f76882b69937c95a5f3": "v2",
    "43797be674a37c1c83ee81081941ed0f": "v3",
    "4f26b9476d0c5033e04162c486074374": "v4",
    "c7e9fce2223f3db685cdfa1e6368728a": "v2Pro",
    "66b313e39455b57ab1b0bc0b239c9d0a": "v2ProPlus",
}
_V2PRO_KEYS = ("sv_emb.", "ge_to512.", "prelu.")


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


MAX_CONFIG_LIST = 1024  # no list of a model config is longer (upsample rates, kernel sizes, conv layers: < 16)
MIN_DIMENSION_BOUND = 1024  # a config integer may exceed every weight dimension up to this (EOS ids, layer counts)


def check_config_scale(path: Path, config: Any, weights: dict[str, np.ndarray]) -> None:
    """Refuse a model config that asks for more than its weights can hold, before any model is built from it:
    every integer at most the larger of :data:`MIN_DIMENSION_BOUND` and the largest dimension of any weight,
    every list at most :data:`MAX_CONFIG_LIST` long (a config of a million layers would build them all first)."""
    biggest = max((max(w.shape, default=1) for w in weights.values()), default=1)
    bound = max(MIN_DIMENSION_BOUND, biggest)
    stack: list[tuple[str, Any]] = [("config", config)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}", v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            if len(value) > MAX_CONFIG_LIST:
                raise CheckpointError(path, f"{where} lists {len(value)} values (at most {MAX_CONFIG_LIST})")
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) and abs(int(value)) > bound:
            raise CheckpointError(path, f"{where} = {int(value)} exceeds every dimension of the weights ({biggest})")


def _check_gpt_config(path: Path, model: dict, weights: dict[str, np.ndarray]) -> None:
    """The GPT's layer count and width are those of its weights (checked before the model is built)."""
    layers = {int(m.group(1)) for k in weights if (m := re.match(r"model\.h\.layers\.(\d+)\.", k))}
    try:
        n_layer, hidden = int(model["n_layer"]), int(model["hidden_dim"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(path, "GPT config['model'] lacks a whole n_layer / hidden_dim") from None
    if layers != set(range(n_layer)):
        raise CheckpointError(path, f"GPT config says {n_layer} layers, the weights hold {len(layers)}")
    emb = weights["model.ar_text_embedding.word_embeddings.weight"]
    if emb.ndim != 2 or emb.shape[1] != hidden:
        raise CheckpointError(path, f"GPT config says hidden_dim {hidden}, the text embedding is {emb.shape}")


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
    if not isinstance(config.get("model"), dict):
        raise CheckpointError(path, "GPT checkpoint has no config['model'] section")
    check_config_scale(path, config["model"], weights)
    _check_gpt_config(path, config["model"], weights)
    n_sym = weights["model.ar_text_embedding.word_embeddings.weight"].shape[0]
    version = "v1" if n_sym == 512 or config["model"].get("phoneme_vocab_size") == 512 else "v2"
    return RawCheckpoint(path, "gpt", weights, config, version, {"info": _plain(obj.get("info"))})


def head_md5(path: str | os.PathLike) -> str:
    """MD5 of the first 8 KiB of a file (upstream ``process_ckpt.get_hash_from_file``)."""
    with open(path, "rb") as f:
        return hashlib.md5(f.read(8192)).hexdigest()


def sovits_version(
    path: Path, weights: dict[str, np.ndarray], header: bytes, config: dict | None = None, md5: str | None = None
) -> str:
    """The SoVITS model version (upstream ``get_sovits_version_from_path_fast``: the pretrained-file hash,
    then the 2-byte tag), checked against the weights. Unlike upstream, an untagged (``PK``) file holding
    the v2Pro layers is read as v2Pro-family (upstream would build it as v2 and fail at decode); its
    ``config.model.version`` picks v2Pro or v2ProPlus (the code is the same, the sizes come from the config)."""
    tagged = PRETRAINED_MD5.get(md5 or "") or VERSION_TAGS.get(header)
    if tagged and tagged not in SUPPORTED_VERSIONS:
        raise _unsupported(path, tagged)
    if any(k.startswith("cfm.") for k in weights):
        raise _unsupported(path, "v3/v4")
    if "enc_p.text_embedding.weight" not in weights:
        raise CheckpointError(path, "not a GPT-SoVITS SoVITS checkpoint (no enc_p.text_embedding)")
    has_sv = any(k.startswith(_V2PRO_KEYS) for k in weights)
    if has_sv:
        missing = [k for k in ("sv_emb.weight", "ge_to512.weight", "prelu.weight") if k not in weights]
        if missing:
            raise CheckpointError(path, f"v2Pro-family SoVITS checkpoint lacks {', '.join(missing)}")
        if tagged in V2PRO_VERSIONS:
            return tagged
        if tagged:  # tagged v1/v2 but holding the speaker-verification layers
            raise CheckpointError(path, f"tagged {tagged} but holds the v2Pro layers (sv_emb, ge_to512, prelu)")
        declared = str(((config or {}).get("model") or {}).get("version") or "")
        return declared if declared in V2PRO_VERSIONS else "v2Pro"
    if tagged in V2PRO_VERSIONS:
        raise CheckpointError(path, f"tagged {tagged} but lacks its speaker-verification layers (sv_emb, ge_to512)")
    n_sym = weights["enc_p.text_embedding.weight"].shape[0]
    return "v1" if n_sym == 322 else "v2"


def sovits_needs_sv(path: str | os.PathLike) -> bool:
    """Whether a SoVITS file (original ``.pth`` or converted folder) is v2Pro-family, i.e. needs the
    speaker-verification model: cheap (hash, tag, and the tensor names of the pickle; no weights read).
    False for anything unreadable (loading it reports the real problem)."""
    path = Path(path)
    try:
        if path.is_dir():
            meta = json.loads((path / "config.json").read_text(encoding="utf-8"))
            return str(meta.get("version")) in V2PRO_VERSIONS
        if not path.is_file():
            return False
        version = PRETRAINED_MD5.get(head_md5(path)) or VERSION_TAGS.get(read_header(path))
        if version is not None:
            return version in V2PRO_VERSIONS
        return b"sv_emb.weight" in pickle_bytes(path)
    except (OSError, ValueError):
        return False


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
    config = _plain(obj.get("config") or {})
    version = sovits_version(path, weights, header, config, head_md5(path) if path.is_file() else None)
    if not isinstance(config.get("model"), dict) or not isinstance(config.get("data"), dict):
        raise CheckpointError(path, "SoVITS checkpoint has no config['model'] / config['data'] section")
    check_config_scale(path, config["model"], weights)
    return RawCheckpoint(path, "sovits", weights, config, version, {"info": _plain(obj.get("info"))})


def sv_config(path: Path, weights: dict[str, np.ndarray]) -> dict[str, Any]:
    """The ERes2NetV2 architecture of a speaker-verification state dict, read off its keys and shapes
    (the file holds no config; upstream builds ``ERes2NetV2(baseWidth=24, scale=4, expansion=4)``)."""
    try:
        m = int(weights["conv1.weight"].shape[0])
        num_blocks = []
        for stage in range(1, 5):
            ids = {int(mt.group(1)) for k in weights if (mt := re.match(rf"layer{stage}\.(\d+)\.", k))}
            if not ids or ids != set(range(len(ids))):
                raise KeyError(f"layer{stage}")
            num_blocks.append(len(ids))
        expansion = int(weights["layer1.0.conv3.weight"].shape[0]) // m
        scale = len({k for k in weights if re.match(r"layer1\.0\.convs\.\d+\.weight$", k)})
        widths = [int(weights[f"layer{s}.0.convs.0.weight"].shape[0]) for s in range(1, 5)]
        feat_dim = 80
        emb = int(weights["seg_1.weight"].shape[0]) if "seg_1.weight" in weights else 0
        if "layer3_ds.weight" not in weights:
            raise KeyError("layer3_ds.weight")
    except KeyError as exc:
        raise CheckpointError(path, f"not an ERes2NetV2 speaker-verification checkpoint (no {exc.args[0]})") from None
    return {
        "m_channels": m,
        "num_blocks": num_blocks,
        "expansion": expansion,
        "scale": scale,
        "widths": widths,
        "feat_dim": feat_dim,
        "embedding_size": emb,
    }


def read_sv(path: str | os.PathLike) -> RawCheckpoint:
    """Read the speaker-verification model of v2Pro voices (``pretrained_eres2netv2w24s4ep4.ckpt``): a
    plain ``torch.save(state_dict)`` of ERes2NetV2; the architecture comes from the shapes."""
    path = Path(path)
    obj = load_torch_file(path)
    if isinstance(obj, dict) and "weight" in obj and isinstance(obj["weight"], dict):
        raise CheckpointError(path, "this is a GPT/SoVITS checkpoint, not the speaker-verification model")
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    weights = _tensor_dict(path, obj, "the state dict")
    return RawCheckpoint(path, "sv", weights, sv_config(path, weights), "eres2netv2")


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
    if not isinstance(config, dict):
        raise CheckpointError(cfg_file, "config.json is not an object")
    check_config_scale(cfg_file, config, weights)
    expected = {"hubert": "hubert", "bert": "bert"}.get(kind)
    model_type = str(config.get("model_type", ""))
    if expected and model_type and model_type != expected:
        raise CheckpointError(path, f"expected a {expected} model, config.json says model_type={model_type!r}")
    return RawCheckpoint(path, kind, weights, config, "v2")
