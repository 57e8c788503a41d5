"""Does streaming keep up? After the first chunk, is every chunk ready before the previous one has finished playing?

``python tests/tools/stream_keeps_up.py --threads 1 [--runs 3] [--text TEXT] [--split cut5] [--models $REF_BIG]``

Uses the real-size random-weight set of the compare tools (``$REF_BIG``, see shared/tools/compare/README.md;
its reference wave is written by the first ``sidebyside.py upstream`` run) through the public engine API, like
``sidebyside.py ours``. A player starts each chunk when it has arrived and the previous one has finished
playing; the margin of chunk i (i >= 1) is the time the previous chunk finishes playing minus chunk i's
arrival (negative = an audible gap of that length, after which playback goes on from the late chunk). The
worst (smallest) margin is printed per run, with every margin and the arrival times. One warm-up run, then
``--runs`` timed runs; prints one ``KEEPSUP {json}`` line. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--text", default="今天的天气特别好，我们一起去公园里散步聊天吧。")
ap.add_argument("--split", default="cut0")
ap.add_argument("--models", default=None)
A = ap.parse_args()
os.environ["PRIMESPEECH_THREADS"] = str(A.threads)

import yaml  # noqa: E402

from dora_primespeech_mlx.engine import GPTSoVITSEngine  # noqa: E402

base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
MODELS = os.path.abspath(A.models or os.environ.get("REF_BIG", os.path.join(base, "primespeech-ref", "ref-big")))
md = tempfile.mkdtemp(prefix="keepsup-")
os.makedirs(os.path.join(md, "voices", "Big"))
with open(os.path.join(md, "voices", "Big", "voice.yaml"), "w") as f:
    yaml.safe_dump({"name": "Big", "language": "zh", "prompt_text": "这是一段用于测试的参考音频。", "prompt_lang": "zh",
                    "speed_factor": 1.0, "reference": os.path.join(MODELS, "ref_5s_32k.wav"),
                    "gpt": os.path.join(MODELS, "gpt", "s1-v2-random.ckpt"),
                    "sovits": os.path.join(MODELS, "sovits", "s2G-v2-random.pth"),
                    "hubert": os.path.join(MODELS, "chinese-hubert-base"),
                    "bert": os.path.join(MODELS, "chinese-roberta-wwm-ext-large")}, f, allow_unicode=True)
eng = GPTSoVITSEngine(model_dir=md)
eng.load_voice("Big")
kw = dict(voice="Big", text_lang="all_zh", text_split_method=A.split, top_k=15, seed=1, speed_factor=1.0)


def one_run():
    t0 = time.perf_counter()
    arrivals, durations = [], []
    for chunk in eng.synthesize_stream(A.text, **kw):
        arrivals.append(time.perf_counter() - t0)
        durations.append(chunk.duration)
    margins, played_until = [], arrivals[0] + durations[0]
    for i in range(1, len(arrivals)):
        margins.append(played_until - arrivals[i])
        played_until = max(arrivals[i], played_until) + durations[i]
    return {"first_s": arrivals[0], "chunks": len(arrivals), "audio_s": sum(durations),
            "worst_margin_s": min(margins) if margins else None,
            "worst_chunk": 1 + margins.index(min(margins)) if margins else None,
            "margins_s": [round(m, 3) for m in margins], "arrivals_s": [round(a, 3) for a in arrivals],
            "durations_s": [round(d, 3) for d in durations]}


one_run()  # warm-up
runs = [one_run() for _ in range(A.runs)]
worst = [r["worst_margin_s"] for r in runs if r["worst_margin_s"] is not None]
print("KEEPSUP " + json.dumps({"threads": A.threads, "split": A.split, "text": A.text, "loadavg": os.getloadavg()[0],
                               "worst_margin_s_min": min(worst) if worst else None,
                               "worst_margin_s_median": statistics.median(worst) if worst else None,
                               "backends": eng.stats().get("backends"), "runs": runs}, ensure_ascii=False,
                              default=str))
