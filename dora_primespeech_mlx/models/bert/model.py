"""Chinese RoBERTa (``chinese-roberta-wwm-ext-large``) text features for the GPT (docs/model.md, "BERT features").

GPT-SoVITS uses ``BertForMaskedLM(..., output_hidden_states=True).hidden_states[-3]``: the embeddings
followed by ``num_hidden_layers - 2`` encoder layers. Only those layers are built and loaded; the last
two layers, the pooler and the MLM head are dropped. [CLS]/[SEP] rows are removed and each character's
vector is repeated ``word2ph[i]`` times -> (hidden, n_phones). The math is in :class:`BertModel`'s docstring,
the converted weights' names and layouts (what the CoreML export reads) in :meth:`BertModel.sanitize`'s."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...runtime import DEFAULT, Runtime
from ..kernels import cpu_paths, half_gemv
from ..kernels.half_gemv import to_float16_exact
from ..shared.activations import gelu
from ..shared.common import to_float32
from ..shared.storage import half_storage
from .numpy_encoder import NumpyBert


@dataclass
class BertArgs:
    vocab_size: int = 21128
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    position_embedding_type: str = "absolute"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BertArgs:
        """Build from a Hugging Face ``config.json`` dict (``BertConfig``); unknown keys are ignored."""
        names = cls.__dataclass_fields__
        args = cls(**{k: v for k, v in config.items() if k in names})
        problems = []
        if args.hidden_act != "gelu":
            problems.append(f"hidden_act={args.hidden_act!r} (only 'gelu' is supported)")
        if args.position_embedding_type != "absolute":
            problems.append(f"position_embedding_type={args.position_embedding_type!r} (need 'absolute')")
        if args.num_hidden_layers < 2:
            problems.append(f"num_hidden_layers={args.num_hidden_layers}: hidden_states[-3] needs at least 2")
        if args.hidden_size % args.num_attention_heads:
            problems.append("hidden_size is not divisible by num_attention_heads")
        if problems:
            raise ValueError("unsupported BERT config: " + "; ".join(problems))
        return args

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def num_layers_run(self) -> int:
        """Encoder layers needed for ``hidden_states[-3]``."""
        return self.num_hidden_layers - 2


class Embeddings(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.norm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids: mx.array) -> mx.array:
        L = input_ids.shape[1]
        x = self.word_embeddings(input_ids)
        x = x + self.position_embeddings.weight[:L] + self.token_type_embeddings.weight[0]
        return self.norm(x)


class Attention(nn.Module):
    def __init__(self, dims: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.scale = (dims // n_heads) ** -0.5
        self.query = nn.Linear(dims, dims)
        self.key = nn.Linear(dims, dims)
        self.value = nn.Linear(dims, dims)
        self.out = nn.Linear(dims, dims)

    def __call__(self, x: mx.array, mask: mx.array | None = None) -> mx.array:
        B, L, D = x.shape
        H = self.n_heads

        def heads(t: mx.array) -> mx.array:
            return t.reshape(B, L, H, D // H).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.out(o.transpose(0, 2, 1, 3).reshape(B, L, D))


class FeedForward(nn.Module):
    def __init__(self, dims: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(dims, hidden)
        self.down = nn.Linear(hidden, dims)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down(gelu(self.up(x)))


class Layer(nn.Module):
    def __init__(self, args: BertArgs):
        super().__init__()
        d, eps = args.hidden_size, args.layer_norm_eps
        self.attention = Attention(d, args.num_attention_heads)
        self.attention_norm = nn.LayerNorm(d, eps=eps)
        self.ffn = FeedForward(d, args.intermediate_size)
        self.ffn_norm = nn.LayerNorm(d, eps=eps)

    def __call__(self, x: mx.array, mask: mx.array | None = None) -> mx.array:
        x = self.attention_norm(x + self.attention(x, mask))
        return self.ffn_norm(x + self.ffn(x))


class BertModel(nn.Module):
    """The encoder up to ``hidden_states[-3]``, float32: embeddings = LayerNorm(word[ids] + position[0..L) +
    token_type[0]); each layer is post-LN ``x = LN(x + Attn(x)); x = LN(x + FFN(x))`` with FFN = Linear -> GELU
    (exact, erf) -> Linear, attention scaled by 1/sqrt(head_dim), padded keys masked out. LayerNorm eps =
    ``layer_norm_eps``."""

    def __init__(self, args: BertArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.layers = [Layer(args) for _ in range(args.num_layers_run)]

    def __call__(
        self,
        input_ids: mx.array,
        attention_mask: mx.array | None = None,
        output_hidden_states: bool = False,
    ) -> mx.array | list[mx.array]:
        """``input_ids`` (B, L) with [CLS]/[SEP] -> ``hidden_states[-3]`` (B, L, H).

        ``attention_mask`` (B, L): 1 for real tokens, 0 for padding (None: all real). With
        ``output_hidden_states=True`` the list [embeddings, layer 1, ..., layer n-2] is returned; its
        last entry is the feature output.
        """
        if input_ids.ndim != 2:
            raise ValueError(f"BERT expects (batch, tokens) input_ids, got shape {tuple(input_ids.shape)}")
        L = input_ids.shape[1]
        if L > self.args.max_position_embeddings:
            raise ValueError(
                f"BERT input has {L} tokens, more than max_position_embeddings="
                f"{self.args.max_position_embeddings}; cut the text into shorter pieces"
            )
        fast = self.fast_path()
        if fast is not None:  # float16 weights on the CPU: numpy + the float16 GEMM kernel (bert/numpy_encoder.py)
            out = fast(np.array(input_ids), None if attention_mask is None else np.array(attention_mask),
                       output_hidden_states)
            return [mx.array(h) for h in out] if output_hidden_states else mx.array(out)
        mask = None
        if attention_mask is not None:
            mask = (attention_mask != 0)[:, None, None, :]  # keys only, broadcast over heads and queries
        x = self.embeddings(input_ids)
        hidden = [x]
        for layer in self.layers:
            x = layer(x, mask)
            if output_hidden_states:
                hidden.append(x)
        return hidden if output_hidden_states else x

    def prepare(self, runtime: Runtime = DEFAULT) -> BertModel:
        """Ready for inference (the loader calls this): ``half`` is the runtime's ``bert_half``
        (``PRIMESPEECH_BERT_HALF``); its ``isa`` / ``bert_gemm`` pick the kernels' build and products' path.

        ``half`` True: the Linear weights and the word embedding are kept in float16 (the released checkpoint
        is float16, so nothing is lost): about half the memory (docs/performance.md, "float16 kernels"). Where MLX runs
        on the CPU and the float16-weight kernels build (``half_gemv.library()``: x86-64 with AVX2/FMA/F16C and a C
        compiler), the model then runs in numpy through those kernels (``models/bert/numpy_encoder.py``), faster than
        float32 MLX; elsewhere (GPUs, other CPUs) MLX computes in float32 from float16 storage (the per-call upcast is
        slow on a CPU). ``None`` (auto, the default): float16 where that fast path is available and every Linear weight
        is a float16 value, else float32. ``False``: float32 MLX."""
        self._fast, self.runtime = None, runtime
        half = runtime.bert_half
        fn = self._fast_kernels()
        if half is None:
            half = fn is not None and self._float16_if_exact(fn)
        if half:
            half_storage(self, embeddings=("embeddings.word_embeddings",), min_elements=0 if fn else None)
            if fn is not None:
                self._fast = NumpyBert(self, fn, self._gemm())
            if hasattr(mx, "clear_cache"):
                mx.clear_cache()  # hand the float32 buffers back
        return self

    def fast_path(self):
        """The numpy float16 forward (:class:`~.bert_numpy.NumpyBert`) when :meth:`prepare` chose it, else None;
        rebuilt when the weights were replaced since."""
        fast = getattr(self, "_fast", None)
        if fast is None:
            return None
        if fast.source is not (self.layers[0].attention.query.weight if self.layers else
                               self.embeddings.word_embeddings.weight):
            if not all(m.weight.dtype == mx.float16 for m in self._linears()):
                self._fast = None
                return None
            fast = self._fast = NumpyBert(self, fast.layers[0].q.fn if fast.layers else self._fast_kernels(),
                                          self._gemm())
        return fast

    def _linears(self) -> list[nn.Linear]:
        return [m for _, m in self.named_modules() if isinstance(m, nn.Linear)]

    def _float16_if_exact(self, fn) -> bool:
        """Store every Linear weight and the word embedding as float16 when all of them are float16 values
        (each checked while it is converted, one pass with the kernel); else leave (or put back) float32."""
        done = []
        # the word embedding (the largest weight) first, while the other float32 weights are not yet read: its
        # float32, numpy and float16 copies side by side then add to the least memory
        for m in [self.embeddings.word_embeddings, *self._linears()]:
            w = m.weight
            if w.dtype != mx.float32:
                continue
            mx.eval(w)
            h = to_float16_exact(np.array(w, copy=False), fn)
            if h is None:  # not float16 values: undo (exact: the converted ones were float16 values)
                for d in done:
                    d.weight = d.weight.astype(mx.float32)
                mx.eval(self.parameters())
                return False
            m.weight = mx.array(h)
            del w, h
            mx.eval(m.weight)
            done.append(m)
        return True

    def _fast_kernels(self):
        """The float16-weight kernels (the runtime's build) when MLX computes on the CPU here, else None."""
        if mx.default_device().type != mx.cpu:
            return None
        runtime = getattr(self, "runtime", DEFAULT)
        return half_gemv.library(runtime.isa, runtime.threads)

    def _gemm(self) -> str:
        """The products' path of the numpy forward (``cpu_paths``: float16 kernel GEMM or BLAS on upcast weights)."""
        return cpu_paths.path("bert", getattr(self, "runtime", DEFAULT))[0]

    @staticmethod
    def sanitize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """HF ``BertForMaskedLM`` / ``BertModel`` state dict -> MLX names: what a converted safetensors file holds and
        what the CoreML export reads.

        Drops the MLM head (``cls.*``), the pooler, ``position_ids`` buffers and the last two encoder
        layers (the layer count is read from the highest layer index present). Linear weights are (out, in), all
        float32. V = vocab, P = max positions, H = hidden, F = intermediate, l = 0 .. num_hidden_layers - 3::

            embeddings.word_embeddings.weight          (V, H)
            embeddings.position_embeddings.weight      (P, H)
            embeddings.token_type_embeddings.weight    (type_vocab, H)   only row 0 is used
            embeddings.norm.weight / .bias             (H,)
            layers.l.attention.query.weight / .bias    (H, H) / (H,)
            layers.l.attention.key.weight / .bias      (H, H) / (H,)
            layers.l.attention.value.weight / .bias    (H, H) / (H,)
            layers.l.attention.out.weight / .bias      (H, H) / (H,)
            layers.l.attention_norm.weight / .bias     (H,)
            layers.l.ffn.up.weight / .bias             (F, H) / (F,)
            layers.l.ffn.down.weight / .bias           (H, F) / (H,)
            layers.l.ffn_norm.weight / .bias           (H,)

        HF name mapping: ``bert.`` prefix stripped; ``encoder.layer.l`` -> ``layers.l``;
        ``attention.self.{query,key,value}`` -> ``attention.{query,key,value}``; ``attention.output.dense`` ->
        ``attention.out``; ``attention.output.LayerNorm`` -> ``attention_norm``; ``intermediate.dense`` ->
        ``ffn.up``; ``output.dense`` -> ``ffn.down``; ``output.LayerNorm`` -> ``ffn_norm``;
        ``embeddings.LayerNorm`` -> ``embeddings.norm``."""
        w = {(k[len("bert.") :] if k.startswith("bert.") else k): v for k, v in weights.items()}
        layer_ids = [int(m.group(1)) for k in w if (m := re.match(r"encoder\.layer\.(\d+)\.", k))]
        n_keep = max(layer_ids) + 1 - 2 if layer_ids else 0
        renames = (
            ("attention.self.", "attention."),
            ("attention.output.dense.", "attention.out."),
            ("attention.output.LayerNorm.", "attention_norm."),
            ("intermediate.dense.", "ffn.up."),
            ("output.dense.", "ffn.down."),
            ("output.LayerNorm.", "ffn_norm."),
        )
        out = {}
        for key, value in w.items():
            if key.startswith(("cls.", "pooler.")) or key.endswith("position_ids"):
                continue
            if key.startswith("embeddings."):
                out[key.replace("embeddings.LayerNorm.", "embeddings.norm.")] = value
                continue
            m = re.match(r"encoder\.layer\.(\d+)\.(.*)$", key)
            if m is None:
                raise ValueError(f"unexpected BERT weight {key!r}")
            idx, rest = int(m.group(1)), m.group(2)
            if idx >= n_keep:
                continue
            for old, new in renames:
                if rest.startswith(old):
                    rest = new + rest[len(old) :]
                    break
            else:
                raise ValueError(f"unexpected BERT weight {key!r}")
            out[f"layers.{idx}.{rest}"] = value
        return to_float32(out)


class BertTokenizer:
    """The Hugging Face BERT tokenizer through the ``tokenizers`` package: ``tokenizer.json`` when the
    folder has one, otherwise a WordPiece tokenizer built from ``vocab.txt`` (+ ``tokenizer_config.json``
    options). Chinese characters and punctuation marks become one token each; ``encode`` adds
    [CLS] ... [SEP] like ``tokenizer(text)`` in transformers."""

    def __init__(self, tokenizer, pad_id: int = 0):
        self._tok = tokenizer
        self.pad_id = int(pad_id)

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> BertTokenizer:
        from tokenizers import Tokenizer

        path = Path(path)
        cfg: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            f = path / name
            if f.is_file():
                try:
                    cfg.update(json.loads(f.read_text(encoding="utf-8")))
                except ValueError as exc:
                    raise ValueError(f"{f}: invalid JSON ({exc})") from None
        special = {
            name: (cfg.get(name) or default)
            for name, default in (
                ("unk_token", "[UNK]"),
                ("cls_token", "[CLS]"),
                ("sep_token", "[SEP]"),
                ("pad_token", "[PAD]"),
                ("mask_token", "[MASK]"),
            )
        }
        special = {k: (v["content"] if isinstance(v, dict) else v) for k, v in special.items()}
        tok_json, vocab_txt = path / "tokenizer.json", path / "vocab.txt"
        if tok_json.is_file():
            try:
                tok = Tokenizer.from_file(str(tok_json))
            except Exception as exc:
                raise ValueError(f"{tok_json}: cannot load tokenizer ({exc})") from None
        elif vocab_txt.is_file():
            tok = _wordpiece_from_vocab(vocab_txt, cfg, special)
        else:
            raise FileNotFoundError(f"{path}: no tokenizer.json or vocab.txt for the BERT tokenizer")
        tok.no_padding()
        tok.no_truncation()
        pad_id = tok.token_to_id(special["pad_token"])
        return cls(tok, 0 if pad_id is None else pad_id)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts))]


def _wordpiece_from_vocab(vocab_txt: Path, cfg: dict[str, Any], special: dict[str, str]):
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab: dict[str, int] = {}
    with open(vocab_txt, encoding="utf-8") as f:
        for i, line in enumerate(f):
            token = line.rstrip("\n")
            vocab.setdefault(token, i)
    for name in ("cls_token", "sep_token", "unk_token"):
        if special[name] not in vocab:
            raise ValueError(f"{vocab_txt}: special token {special[name]!r} is not in the vocabulary")
    tok = Tokenizer(WordPiece(vocab, unk_token=special["unk_token"], max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=bool(cfg.get("tokenize_chinese_chars", True)),
        strip_accents=cfg.get("strip_accents"),
        lowercase=bool(cfg.get("do_lower_case", True)),
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_t, sep_t = special["cls_token"], special["sep_token"]
    tok.post_processor = processors.BertProcessing((sep_t, vocab[sep_t]), (cls_t, vocab[cls_t]))
    tok.add_special_tokens([t for t in special.values() if t in vocab])
    return tok


def phone_features(char_feats, word2ph: Sequence[int]) -> np.ndarray:
    """(n_chars, H) character features -> (H, n_phones): row i repeated ``word2ph[i]`` times."""
    feats = np.asarray(char_feats, dtype=np.float32)
    counts = np.asarray(word2ph, dtype=np.int64)
    if feats.ndim != 2:
        raise ValueError(f"char features must be (n_chars, hidden), got shape {feats.shape}")
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("word2ph must be a 1-D list of non-negative phone counts")
    if len(counts) > feats.shape[0]:
        raise ValueError(
            f"word2ph has {len(counts)} entries but the tokenizer produced only {feats.shape[0]} "
            "character tokens (every character of the normalised text must be one token)"
        )
    return np.ascontiguousarray(np.repeat(feats[: len(counts)], counts, axis=0).T)


def _check_item(norm_text: str, word2ph: Sequence[int]) -> None:
    if len(word2ph) != len(norm_text):
        raise ValueError(
            f"BERT features: len(word2ph)={len(word2ph)} != len(norm_text)={len(norm_text)} "
            f"for {norm_text!r} (word2ph needs one entry per character of the normalised text)"
        )


def bert_features(
    model: BertModel, tokenizer: BertTokenizer, norm_text: str, word2ph: Sequence[int]
) -> np.ndarray:
    """The GPT's BERT input for one Chinese segment: (H, n_phones) float32."""
    _check_item(norm_text, word2ph)
    ids = tokenizer.encode(norm_text)
    hidden = model(mx.array([ids], dtype=mx.int32))
    return phone_features(np.array(hidden[0, 1:-1]), word2ph)


def bert_features_batch(
    model: BertModel, tokenizer: BertTokenizer, items: Sequence[tuple[str, Sequence[int]]]
) -> list[np.ndarray]:
    """:func:`bert_features` for several segments in one padded forward pass (same results)."""
    if not items:
        return []
    for norm_text, word2ph in items:
        _check_item(norm_text, word2ph)
    encoded = tokenizer.encode_batch([t for t, _ in items])
    L = max(len(ids) for ids in encoded)
    ids = np.full((len(encoded), L), tokenizer.pad_id, dtype=np.int32)
    mask = np.zeros((len(encoded), L), dtype=np.int32)
    for i, row in enumerate(encoded):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    hidden = np.array(model(mx.array(ids), mx.array(mask)))
    return [
        phone_features(hidden[i, 1 : len(row) - 1], word2ph)
        for i, (row, (_, word2ph)) in enumerate(zip(encoded, items))
    ]
