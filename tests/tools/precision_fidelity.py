"""Fidelity of the reduced-precision paths (PRIMESPEECH_PRECISION=int8|bf16|int8_bf16) against exact, on fixtures.

    python tests/tools/precision_fidelity.py [--fixtures DIR ...] [--precision int8_bf16] [--json]

For every case of each fixture set's ``models/cases.json`` that holds semantic tokens (the ``gpt*`` cases and the
``e2e`` cases), the fixture GPT is loaded twice, exact and at the reduced precision (``int8``: its decode step), and
both decode the case's inputs with the same sampling: its recorded exponential noise where it has one, else the same
seed (0). The fixture SoVITS is loaded twice too: its vocoder as the engine runs it on this machine (ONNX Runtime on
the CPU) and at the reduced precision (``bf16``: OpenVINO in bfloat16). Printed per case:

- token agreement: the share of positions (up to the shorter decode) where both chose the same token, the first
  position that differs, and both lengths;
- the largest logit difference along the exact decode's own tokens (teacher-forced, every step), next to the
  case's logits tolerance;
- for a case with a reference and target phones (``e2e``): the mel distance of the two decodes' audio, each through
  its SoVITS with no noise (noise scale 0, so only the tokens and the vocoder's precision differ): the mean absolute
  difference of log10 mel spectrograms (80 bands, 1024-point frames, hop 256) over the shorter audio, and the
  lengths (and, where both have the same length, the largest sample difference next to the case's audio
  tolerance); for scale,
  the same distance between the exact tokens' audio without noise and with the SoVITS noise every synthesis of the
  original draws (noise scale 0.5, seed 1): what one exact run moves against another.

Where the CPU cannot run a reduced precision (int8: not the AVX-512 kernels; bf16: no AVX-512 BF16 / AMX, or no
OpenVINO) that side runs exact too, and the ``ran`` and ``vocoder`` columns say what ran. A measurement of fidelity,
not a test: ``tests/models/test_precision.py`` runs it over the fixtures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO)]  # this checkout's package

from dora_primespeech_mlx import _blas  # noqa: E402  (the BLAS before MLX)

_blas.preload()

import numpy as np  # noqa: E402

TOKENS = ("tokens", "semantic_tokens")
PHONES = ("phones", "all_phones")
BERT = ("bert_features", "all_bert_features")
LOGITS_TOL = ("step_logits", "gpt_step_logits")


def default_fixtures() -> list[Path]:
    env = os.environ.get("PRIMESPEECH_FIXTURES")
    return [Path(env)] if env else [REPO.parent / "shared" / "fixtures"]


def _first(d, names):
    return next((d[n] for n in names if n in d.files), None)


def _sampling(case, model):
    from dora_primespeech_mlx.models.gpt.generate import SamplingParams

    p = case.get("params") or case.get("inputs") or {}
    params = SamplingParams(
        top_k=p.get("top_k", SamplingParams.top_k), top_p=float(p.get("top_p", SamplingParams.top_p)),
        temperature=float(p.get("temperature", SamplingParams.temperature)),
        repetition_penalty=float(p.get("repetition_penalty", SamplingParams.repetition_penalty)))
    esn = p.get("early_stop_num", case.get("early_stop_num"))
    return params, int(model.args.early_stop_num if esn is None else esn)


def _noise(d):
    """The case's recorded exponential noise (EOS-masked steps, then the rest), or None."""
    if "exp_noise_first11" not in d.files:
        return None
    first, rest = d["exp_noise_first11"], d["exp_noise_rest"]
    return lambda step, width: first[step] if step < first.shape[0] else rest[step - first.shape[0]]


def _logits_tolerance(case, cases):
    for n in LOGITS_TOL:
        t = case.get("tolerance", {}).get(n)
        if isinstance(t, dict):
            return t
    return next((c["tolerance"]["step_logits"] for c in cases
                 if isinstance(c.get("tolerance", {}).get("step_logits"), dict)), None)


def log_mel(wave: np.ndarray, sr: int, n_fft: int = 1024, hop: int = 256, bands: int = 80) -> np.ndarray:
    """log10 of an 80-band (HTK) mel power spectrogram, (frames, bands); Hann window, no centring."""
    wave = np.asarray(wave, dtype=np.float64).reshape(-1)
    if wave.size < n_fft:
        wave = np.pad(wave, (0, n_fft - wave.size))
    frames = np.lib.stride_tricks.sliding_window_view(wave, n_fft)[::hop] * np.hanning(n_fft)
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    hz = lambda m: 700.0 * (10 ** (m / 2595.0) - 1.0)  # noqa: E731
    edges = hz(np.linspace(mel(0.0), mel(sr / 2), bands + 2))
    freqs = np.linspace(0.0, sr / 2, n_fft // 2 + 1)
    fb = np.zeros((bands, freqs.size))
    for b in range(bands):
        lo, mid, hi = edges[b], edges[b + 1], edges[b + 2]
        fb[b] = np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0.0, None)
    return np.log10(power @ fb.T + 1e-10)


def mel_distance(a: np.ndarray, b: np.ndarray, sr: int) -> float:
    """Mean |log10 mel(a) - log10 mel(b)| over the frames both have."""
    ma, mb = log_mel(a, sr), log_mel(b, sr)
    n = min(len(ma), len(mb))
    return float(np.mean(np.abs(ma[:n] - mb[:n]))) if n else 0.0


def run_set(root: Path, precision: str = "int8_bf16") -> list[dict]:
    import mlx.core as mx

    from dora_primespeech_mlx.convert.checkpoints import read_gpt, read_sovits
    from dora_primespeech_mlx.convert.load import from_checkpoint
    from dora_primespeech_mlx.models import audio
    from dora_primespeech_mlx.models.gpt.generate import generate_all
    from dora_primespeech_mlx.models.sovits import vocoder
    from dora_primespeech_mlx.runtime import Runtime

    meta = json.loads((root / "models" / "cases.json").read_text(encoding="utf-8"))
    cases = meta.get("cases", [])
    raw = read_gpt(str(root / "models" / meta["checkpoints"]["gpt"]))
    models = {p: from_checkpoint(raw, Runtime(precision=p)) for p in ("exact", precision)}
    used = models[precision].decoder.weights().precision if hasattr(models[precision].decoder, "weights") else "exact"
    sovits: dict[str, object] = {}
    rows = []
    for case in cases:
        d = np.load(root / "models" / case["file"])
        tokens_golden = _first(d, TOKENS)
        phones, bert = _first(d, PHONES), _first(d, BERT)
        if tokens_golden is None or phones is None or bert is None or "prompt_semantic" not in d.files:
            continue
        phones = np.asarray(phones).reshape(1, -1)
        bert = np.asarray(bert, dtype=np.float32)
        bert = bert.reshape(1, bert.shape[-2], bert.shape[-1])
        prompt = np.asarray(d["prompt_semantic"]).reshape(1, -1)
        params, esn = _sampling(case, models["exact"])
        out = {}
        for p, m in models.items():
            out[p] = generate_all(m, phones, bert, prompt, params, esn, noise=_noise(d), seed=0).tokens
        a, b = out["exact"], out[precision]
        n = min(len(a), len(b))
        same = a[:n] == b[:n]
        row = {"set": str(root), "case": case["name"], "precision_run": used, "vocoder_run": "-",
               "tokens_exact": int(len(a)), "tokens_other": int(len(b)), "agreement": float(same.mean()) if n else 1.0,
               "first_difference": int(np.argmin(same)) if n and not same.all() else None}
        # teacher-forced: both decoders fed the exact decode's tokens, every step's logits compared
        logits = {}
        for p, m in models.items():
            state, first = m.decoder.prefill(phones, bert, prompt, len(a) + 1)
            steps = [np.asarray(first)]
            for k, t in enumerate(a):
                steps.append(np.asarray(state.step(int(t), prompt.shape[1] + k)))
            logits[p] = np.stack(steps)
        tol = _logits_tolerance(case, cases)
        row["max_logit_difference"] = float(np.max(np.abs(logits["exact"] - logits[precision])))
        row["logits_atol"] = tol.get("atol") if tol else None
        if "text_phones" in d.files and "ref_wav_32k_int16" in d.files:
            if not sovits:
                raw_sovits = read_sovits(str(root / "models" / meta["checkpoints"]["sovits"]))
                for p, prec in (("exact", "f32"), (precision, "bf16" if "bf16" in precision.split("_") else "f32")):
                    m = from_checkpoint(raw_sovits)
                    m.use_vocoder(vocoder.build(m, None, release_mlx=False, precision=prec))
                    sovits[p] = m
            ref = sovits["exact"]
            row["vocoder_run"] = f"{sovits[precision].vocoder_backend.active}:" + str(
                (sovits[precision].vocoder_backend.generator.describe() or {}).get("precision", "f32")
                if sovits[precision].vocoder_backend.generator is not None else "mlx")
            wav = d["ref_wav_32k_int16"].astype(np.float32) / 32768.0
            spec = audio.spectrogram(wav, ref.args.filter_length, ref.args.hop_length, ref.args.win_length)
            target = np.asarray(d["text_phones"]).reshape(1, -1)
            waves = [np.asarray(sovits[p].decode(np.asarray(t).reshape(1, 1, -1), target, spec, noise_scale=0.0))[0, 0]
                     for p, t in (("exact", a), (precision, b))]
            mx.eval()
            row["mel_distance"] = mel_distance(waves[0], waves[1], ref.sampling_rate)
            # the scale: the exact tokens decoded with the original's own SoVITS noise (noise scale 0.5, seed 1),
            # what one run of the exact pipeline moves against another
            wc = np.asarray(ref.decode(np.asarray(a).reshape(1, 1, -1), target, spec, noise_scale=0.5, seed=1))[0, 0]
            row["mel_distance_noise"] = mel_distance(waves[0], wc, ref.sampling_rate)
            row["audio_s"] = [round(len(w) / ref.sampling_rate, 3) for w in waves]
            if len(waves[0]) == len(waves[1]):  # against the case's audio tolerance (the original vs this package)
                row["audio_max_difference"] = float(np.max(np.abs(waves[0] - waves[1])))
                row["audio_atol"] = (case.get("tolerance", {}).get("sovits_audio") or {}).get("atol")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", type=Path, action="append", help="fixture root(s) (default: PRIMESPEECH_FIXTURES "
                    "or ../shared/fixtures)")
    ap.add_argument("--precision", default="int8_bf16", choices=("int8", "bf16", "int8_bf16"))
    ap.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    args = ap.parse_args(argv)
    roots = args.fixtures or default_fixtures()
    rows = []
    for root in roots:
        if not (root / "models" / "cases.json").is_file():
            print(f"no models/cases.json under {root}", file=sys.stderr)
            return 2
        rows += run_set(root, args.precision)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"{'set':<16} {'case':<16} {'ran':<6} {'vocoder':<15} {'agree':>6} {'first diff':>10} {'tokens':>9} "
          f"{'max dlogit':>11} {'(atol)':>7} {'mel dist':>9} {'(noise)':>9} {'max daudio':>10} {'(atol)':>7}")
    for r in rows:
        first = "-" if r["first_difference"] is None else str(r["first_difference"])
        mel = f"{r['mel_distance']:.4f}" if "mel_distance" in r else "-"
        seed1 = f"{r['mel_distance_noise']:.4f}" if "mel_distance_noise" in r else "-"
        daudio = f"{r['audio_max_difference']:.2e}" if "audio_max_difference" in r else "-"
        print(f"{Path(r['set']).name:<16} {r['case']:<16} {r['precision_run']:<6} {r['vocoder_run']:<15} "
              f"{r['agreement']:>6.3f} {first:>10} "
              f"{r['tokens_exact']:>4}/{r['tokens_other']:<4} {r['max_logit_difference']:>11.3e} "
              f"{r['logits_atol'] if r['logits_atol'] is not None else '-':>7} {mel:>9} {seed1:>9} "
              f"{daudio:>10} {r.get('audio_atol') or '-':>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
