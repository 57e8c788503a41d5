"""Co-tenants for ``primespeech-mlx bench --conversation --cotenant SPEC``: a process that runs beside a side while it
is measured, as the LLM writing the answer shares the machine with the TTS (docs/conversation.md). ``SPEC`` is
``KIND`` or ``KIND:key=value,...``:

- ``loop`` (``threads=1,mb=400,rate=48,dim=2048``): each token a chain of float32 matrix-vector products over ``mb``
  MB of random weights (square layers of ``dim`` rows) on ``threads`` BLAS threads, paced to ``rate`` tokens/s
  (``0``: as fast as it can); memory-bound like a CPU LLM. numpy only.
- ``llama`` (``threads=1,rate=0,shape=qwen2.5-0.5b,quant=q8_0,ctx=512``, ``model=PATH``, ``python=PATH``): llama.cpp
  (llama-cpp-python, the extra ``llm``) decoding greedily, random weights in a Qwen2 shape (:data:`SHAPES`) written
  as GGUF with the ``gguf`` package (:func:`write_gguf`; no download), cached under ``~/.cache/primespeech-ref``.

The process prints ``READY`` after its first token; at the end of its standard input it stops and prints
``DONE {json}`` (tokens, seconds, tokens/s). This file imports only the standard library at its top and runs as a
script (``python cotenant.py KIND OPTIONS_JSON``), so another interpreter (``python=``) can run it by its path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KINDS: dict[str, dict[str, type]] = {
    "loop": {"threads": int, "mb": float, "rate": float, "dim": int},
    "llama": {"threads": int, "rate": float, "shape": str, "quant": str, "ctx": int, "model": str, "python": str},
}
DEFAULTS: dict[str, dict[str, object]] = {
    "loop": {"threads": 1, "mb": 400.0, "rate": 48.0, "dim": 2048},
    "llama": {"threads": 1, "rate": 0.0, "shape": "qwen2.5-0.5b", "quant": "q8_0", "ctx": 512},
}
# Qwen2.5 configurations (the released models' config.json): hidden, layers, heads, kv heads, FFN, vocab.
SHAPES = {"qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936), "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936),
          "tiny": (64, 2, 4, 2, 128, 512)}  # tiny: the tests' quick check that the runtime runs
READY_TIMEOUT_S = 600.0  # writing a GGUF of random weights takes a while the first time


@dataclass
class CotenantSpec:
    kind: str
    options: dict[str, object] = field(default_factory=dict)
    text: str = ""

    @property
    def threads(self) -> int:
        return int(self.options["threads"])


def parse(text: str) -> CotenantSpec:
    """``KIND[:key=value,...]`` -> a spec with every option (defaults filled in); ValueError says what is wrong."""
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown co-tenant {kind!r} (use {', '.join(KINDS)})")
    options = dict(DEFAULTS[kind])
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in KINDS[kind]:
            raise ValueError(f"co-tenant {kind}: {item!r} is not one of {', '.join(f'{k}=...' for k in KINDS[kind])}")
        try:
            options[key] = KINDS[kind][key](value)
        except ValueError:
            raise ValueError(f"co-tenant {kind}: {key}={value!r} is not a {KINDS[kind][key].__name__}") from None
    if options["threads"] < 1 or options["rate"] < 0 or options.get("mb", 1) <= 0 or options.get("dim", 1) < 1:
        raise ValueError(f"co-tenant {text!r}: threads >= 1, rate >= 0, mb > 0, dim >= 1")
    if kind == "llama" and (options["shape"] not in SHAPES or options["quant"] not in ("q8_0", "f16")):
        raise ValueError(f"co-tenant llama: shape is one of {', '.join(SHAPES)}, quant q8_0 or f16")
    return CotenantSpec(kind, options, text.strip())


class Cotenant:
    """One running co-tenant process: :meth:`start` returns once it writes tokens, :meth:`stop` ends it and
    returns what it achieved."""

    def __init__(self, spec: CotenantSpec, env: dict[str, str] | None = None):
        self.spec = spec
        if env is None:  # this process's environment, as the settings hand it to child processes
            from ..settings import child_env

            env = child_env()
        self.env = dict(env)
        self.proc: subprocess.Popen | None = None
        self._stderr = tempfile.TemporaryFile("w+")

    def command(self) -> list[str]:
        python = str(self.spec.options.get("python") or sys.executable)
        return [python, str(Path(__file__).resolve()), self.spec.kind, json.dumps(self.spec.options)]

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        n = str(self.spec.threads)  # the co-tenant's own BLAS / OpenMP threads, read when its libraries load
        env = {**self.env, "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, env=env)
        ready = threading.Event()
        threading.Thread(target=lambda: (self.proc.stdout.readline() == "READY\n") and ready.set(),
                         daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"co-tenant {self.spec.text} did not start: {self.errors()}")

    def stop(self, timeout: float = 60.0) -> dict:
        """Ends it (the end of its standard input) and returns its ``DONE`` figures."""
        assert self.proc is not None, "not started"
        try:
            out, _ = self.proc.communicate(input="", timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        for line in (out or "").splitlines():
            if line.startswith("DONE "):
                return json.loads(line[5:])
        raise RuntimeError(f"co-tenant {self.spec.text} ended without figures (exit {self.proc.returncode}): "
                           f"{self.errors()}")

    def errors(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:]

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---- the co-tenant process ---------------------------------------------------------------------------------------


def started(spec: CotenantSpec, env: dict[str, str] | None = None) -> tuple[Cotenant | None, str | None]:
    """A co-tenant started (``Cotenant.start``: writing tokens), or None and why it could not start."""
    running = Cotenant(spec, env)
    try:
        running.start()
    except RuntimeError as exc:
        return None, str(exc)
    return running, None


def paced(step, rate: float, stop: threading.Event) -> dict:
    """Call ``step()`` (one token) until ``stop``; token ``i`` starts no earlier than ``i / rate`` s after the first
    (no catching up after a slow token: an LLM writes as fast as it can up to its rate). ``READY`` after the first."""
    step()
    print("READY", flush=True)
    t0 = time.perf_counter()
    count, period, cpu0 = 0, 1.0 / rate if rate > 0 else 0.0, time.process_time()
    next_at = t0
    while not stop.is_set():
        wait = next_at - time.perf_counter()
        if wait > 0 and stop.wait(wait):
            break
        started = time.perf_counter()
        step()
        count += 1
        next_at = max(next_at + period, started) if period else started
    seconds = time.perf_counter() - t0
    return {"tokens": count, "seconds": round(seconds, 3), "tokens_per_s": round(count / seconds, 2) if seconds else 0,
            "cpu_s": round(time.process_time() - cpu0, 3)}


def loop_step(mb: float, dim: int, seed: int = 0):
    """The loop's token: ``x <- normalise(W_l @ x)`` through every layer (float32, ~``mb`` MB of weights)."""
    import numpy as np

    layers = max(1, round(mb * 1e6 / (4 * dim * dim)))
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal((dim, dim), dtype=np.float32) for _ in range(layers)]
    x = rng.standard_normal(dim, dtype=np.float32)

    def step():
        nonlocal x
        for w in weights:
            x = w @ x
            x /= float(np.linalg.norm(x)) or 1.0
    return step


def write_gguf(path: Path, shape: str, quant: str, seed: int = 0) -> None:
    """A GGUF file of random weights in the shape of ``shape`` (Qwen2 architecture, tied embeddings, no tokenizer:
    the co-tenant feeds token ids)."""
    import gguf
    import numpy as np

    hidden, layers, heads, kv_heads, ffn, vocab = SHAPES[shape]
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType.Q8_0 if quant == "q8_0" else gguf.GGMLQuantizationType.F16
    w = gguf.GGUFWriter(str(path) + ".part", "qwen2")
    w.add_name(f"random {shape}")
    w.add_context_length(32768)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("none")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)

    def matrix(name: str, rows: int, cols: int) -> None:
        a = (rng.standard_normal((rows, cols), dtype=np.float32) * (0.5 / cols ** 0.5))
        if quant == "q8_0":
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a.astype(np.float16))

    def vector(name: str, n: int, value: float | None = None) -> None:
        v = np.full(n, value, np.float32) if value is not None else rng.standard_normal(n, dtype=np.float32) * 0.02
        w.add_tensor(name, v)

    matrix("token_embd.weight", vocab, hidden)
    vector("output_norm.weight", hidden, 1.0)
    for i in range(layers):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", hidden, 1.0)
        matrix(b + "attn_q.weight", hidden, hidden)
        vector(b + "attn_q.bias", hidden)
        matrix(b + "attn_k.weight", kv_heads * head_dim, hidden)
        vector(b + "attn_k.bias", kv_heads * head_dim)
        matrix(b + "attn_v.weight", kv_heads * head_dim, hidden)
        vector(b + "attn_v.bias", kv_heads * head_dim)
        matrix(b + "attn_output.weight", hidden, hidden)
        vector(b + "ffn_norm.weight", hidden, 1.0)
        matrix(b + "ffn_gate.weight", ffn, hidden)
        matrix(b + "ffn_up.weight", ffn, hidden)
        matrix(b + "ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(path) + ".part", path)


def llama_step(options: dict):
    """The llama co-tenant's token: one greedy decode step of llama.cpp (the context starts over when full)."""
    import numpy as np
    from llama_cpp import Llama

    model = Path(options.get("model") or Path.home() / ".cache" / "primespeech-ref" / "cotenant"
                 / f"{options['shape']}-{options['quant']}-random.gguf")
    if not model.is_file():
        model.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(model, str(options["shape"]), str(options["quant"]))
    n = int(options["threads"])
    llm = Llama(str(model), n_ctx=int(options["ctx"]), n_threads=n, n_threads_batch=n, n_batch=64, verbose=False)
    state, vocab = {"token": 1}, llm.n_vocab()

    def step():
        if llm.n_tokens >= llm.n_ctx() - 1:
            llm.reset()
        llm.eval([state["token"]])  # the last token's logits, read from the context (no logits_all copy)
        state["token"] = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
    return step


def main(argv: list[str]) -> int:
    kind, options = argv[0], json.loads(argv[1])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    step = loop_step(float(options["mb"]), int(options["dim"])) if kind == "loop" else llama_step(options)
    result = paced(step, float(options["rate"]), stop)
    print("DONE " + json.dumps({"kind": kind, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
