"""The bench's real-size random-weight v2 models: built once, cached, loaded like a real voice; the
bench inputs (reference, prompt and target texts) and their sizes.

The models: GPT d=512 x 24 layers, SoVITS v2 with its 512-channel HiFi-GAN, chinese-hubert-base,
chinese-roberta-wwm-ext-large. The inputs follow the upstream PyTorch baseline (docs/performance.md, "The stage bench"):
a 5 s reference, the prompt "这是一段用于测试的参考音频。" (27 phones, 139 prompt tokens) and the 20-character target
"今天的天气特别好，我们一起去公园里散步聊天吧。" (44 phones, 23 BERT tokens), 100 semantic tokens (the GPT's EOS
is made unreachable and ``max_sec`` is 2, so every run decodes exactly 100)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

from ..settings import process_setting
from .measure import _preload_blas

PROMPT_TEXT = "这是一段用于测试的参考音频。"


TARGET_TEXT = "今天的天气特别好，我们一起去公园里散步聊天吧。"


REF_SECONDS = 5.0


N_PROMPT_PHONES = 27  # what the v2 front end gives for PROMPT_TEXT


N_TARGET_PHONES = 44  # ... and for TARGET_TEXT


N_BERT_TOKENS = 23  # [CLS] + 21 characters + [SEP]


N_PROMPT_TOKENS = 139  # HuBERT frames of 5.6 s at 16 kHz, halved by ssl_proj


N_TOKENS = 100


BENCH_MAX_SEC = N_TOKENS / 50  # early_stop_num = 50 * max_sec = 100


MODELS_FORMAT = 3  # bump when the generated files change


def default_models_dir() -> Path:
    return Path(process_setting("cache_dir")) / f"bench-models-v{MODELS_FORMAT}"


def _save_converted(dst: Path, kind: str, args, model) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    dst.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    meta = {"format_version": 1, "kind": kind, "version": "v2", "args": args.to_dict(), "source": "bench (random)"}
    (dst / "config.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")


def _suppress_eos(model) -> None:
    """Make the GPT's EOS logit -1e4 for every input: one feature of the last block's output is set to
    a constant 1 (LayerNorm weight 0, bias 1) and only the EOS row of the head reads it."""
    import mlx.core as mx

    last = model.layers[-1].norm2
    last.weight = last.weight.at[0].add(-last.weight[0])
    last.bias = last.bias.at[0].add(1.0 - last.bias[0])
    w = model.predict.weight
    w = w.at[:, 0].multiply(0.0)
    model.predict.weight = w.at[model.args.eos, 0].add(-1e4)
    mx.eval(model.parameters())


def _float16_values(model) -> None:
    """Round every float32 weight to the nearest float16 value (kept as float32): the released
    checkpoints are float16, and paths that keep them in float16 check for it (numpy_decoder.half_weights)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    params = [(k, v.astype(mx.float16).astype(mx.float32)) for k, v in tree_flatten(model.parameters())
              if v.dtype == mx.float32]
    model.update(tree_unflatten(params))


def _bench_vocab(size: int) -> list[str]:
    """A BERT vocabulary of the real size: specials, ASCII and punctuation, then CJK characters."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [chr(c) for c in range(33, 127)] + list("，。！？、；：“”‘’（）《》…—·")
    cjk = 0x4E00
    while len(words) < size:
        words.append(chr(cjk))
        cjk += 1
    return words[:size]


def _write_reference(path: Path, seconds: float = REF_SECONDS, sr: int = 32000) -> None:
    """A speech-like 5 s clip (harmonics of a gliding pitch, amplitude-modulated syllables, noise)."""
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    x = 0.25 * env * voiced / 3 + 0.01 * np.random.default_rng(0).standard_normal(len(t))
    pcm = np.clip(x * 32767, -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def make_models(root: Path) -> Path:
    """Write the four random-weight real-size models (converted MLX folders), a BERT tokenizer and a
    reference clip into ``root``; returns ``root``. Skips what is already there."""
    _preload_blas()
    import mlx.core as mx

    from ..models.bert.model import BertArgs, BertModel
    from ..models.gpt.model import T2SArgs, T2SModel
    from ..models.hubert.model import HubertArgs, HubertModel
    from ..models.sovits.model import SoVITSArgs, SoVITSModel

    root.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    builders = {
        "gpt": lambda: T2SArgs(max_sec=BENCH_MAX_SEC),
        "sovits": SoVITSArgs,
        "hubert": HubertArgs,
        "bert": BertArgs,
    }
    classes = {"gpt": T2SModel, "sovits": SoVITSModel, "hubert": HubertModel, "bert": BertModel}
    for kind, make_args in builders.items():
        dst = root / kind
        if (dst / "model.safetensors").is_file():
            continue
        args = make_args()
        model = classes[kind](args)
        if kind == "gpt":
            _suppress_eos(model)
        _float16_values(model)  # like the released checkpoints, which store float16 weights
        mx.eval(model.parameters())
        _save_converted(dst, kind, args, model)
        if kind == "bert":
            (dst / "vocab.txt").write_text("\n".join(_bench_vocab(args.vocab_size)) + "\n", encoding="utf-8")
        del model
        gc.collect()
    ref = root / "reference.wav"
    if not ref.is_file():
        _write_reference(ref)
    return root


def ensure_models(root: Path) -> Path:
    """Build the models in a child process (so building does not count in this process's peak RSS)."""
    done = all((root / k / "model.safetensors").is_file() for k in ("gpt", "sovits", "hubert", "bert"))
    if done and (root / "reference.wav").is_file():
        return root
    print(f"bench: writing random-weight real-size models to {root} (once) ...", file=sys.stderr)
    code = "import sys, pathlib; from dora_primespeech_mlx.bench import weights as w; "
    code += "w.make_models(pathlib.Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(root)], check=True)
    return root


def bench_voice(root: Path):
    from ..assets.catalog import VoiceSpec

    return VoiceSpec(
        name="bench",
        language="zh",
        prompt_text=PROMPT_TEXT,
        prompt_lang="zh",
        speed_factor=1.0,
        gpt=root / "gpt",
        sovits=root / "sovits",
        reference=root / "reference.wav",
        hubert=root / "hubert",
        bert=root / "bert",
        source="custom",
    )


def gpt_inputs(gpt, rng, n_prompt: int = N_PROMPT_TOKENS):
    """The bench request's GPT inputs, random: phone ids (1, prompt + target phones), BERT features (1, 1024, same)
    and prompt tokens (1, ``n_prompt``), drawn from ``rng`` in that order."""
    phones = rng.integers(0, gpt.args.phoneme_vocab_size, (1, N_PROMPT_PHONES + N_TARGET_PHONES)).astype(np.int32)
    feats = (0.1 * rng.standard_normal((1, 1024, phones.shape[1]))).astype(np.float32)
    prompt = rng.integers(0, 1024, (1, n_prompt)).astype(np.int32)
    return phones, feats, prompt


def weight_bytes_per_token(gpt, kv_rows: float) -> int:
    """Bytes a decode step must read: every block weight, the head, and the KV cache rows attended."""
    from mlx.utils import tree_flatten

    total = 0
    for name, p in tree_flatten(gpt.parameters()):
        if name.startswith(("layers.", "predict.")):
            total += p.nbytes
    a = gpt.args
    total += int(a.num_layers * 2 * kv_rows * a.hidden_dim * 4)
    return total
