"""An LLM-paced stream through the node: sentences arrive one by one while earlier ones are spoken. Batched
(continuous batching, PRIMESPEECH_BATCH) against one after another.

``python tests/tools/paced_stream.py --threads 1 [--runs 3] [--sentences 5] [--every 0.3] [--models $REF_BIG]``
(``PRIMESPEECH_ISA=avx2`` in the environment forces that build of the kernels, as in the node)

The node's real message handler (streaming, the node's worker and queue, a recording send) and engine run on the
real-size random-weight set of the compare tools (``$REF_BIG``: every sentence decodes exactly 100 tokens, 4 s of
audio). A feeder sends ``--sentences`` Chinese sentences as separate ``text`` messages, one every ``--every``
seconds, as a segmenter behind an LLM does. A player starts each audio chunk when it has arrived and the previous
one has finished playing. Per run: the first audio (from the first text), the time from the last text to the last
audio, the total playback gap after the first audio (the sum of the waits for a late chunk) and the worst one.

Variants (``--variant NAME:key=value,...``, repeatable; default ``sequential:batch=1`` and ``batched:batch=4``) run
in turn within every round, after one warm-up each: ``batch`` (rows per decode step), ``admit`` (seconds of
unplayed audio a stream needs before a waiting sentence joins; engine/batching.py ADMIT_QUEUED_S), ``join=1``
(sentences join also while the pacer covers, engine/pacing.py). Prints one
``PACED {json}`` line per variant; ``--trace`` also prints each run's timeline (``TRACE`` lines: a sentence joining
the decode with the rows stepping and the audio in hand then, each audio chunk with the gap before it). Not a
test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--sentences", type=int, default=5)
ap.add_argument("--every", type=float, default=0.3)
ap.add_argument("--models", default=None)
ap.add_argument("--variant", action="append", default=[])
ap.add_argument("--trace", action="store_true", help="print each run's joins, audio and gaps on one timeline")
A = ap.parse_args()
os.environ["PRIMESPEECH_THREADS"] = str(A.threads)

import pyarrow as pa  # noqa: E402
from ref_big import model_dir_with_big, models_dir  # noqa: E402

from dora_primespeech_mlx.dataflow.handler import MessageHandler  # noqa: E402
from dora_primespeech_mlx.dataflow.transport import DirectTransport  # noqa: E402
from dora_primespeech_mlx.engine import batching, pacing  # noqa: E402
from dora_primespeech_mlx.node import engine_factory  # noqa: E402
from dora_primespeech_mlx.settings import Settings  # noqa: E402

SENTENCES = ["今天的天气特别好，我们一起去公园里散步聊天吧。", "公园里有很多人在跑步，还有小朋友在放风筝。",
             "我们可以先去湖边看看，然后找个地方坐下来喝茶。", "中午的时候，附近那家面馆的牛肉面非常好吃。",
             "下午如果还有时间，我们再去书店里逛一逛。", "晚上回家之前，记得去超市买一些水果和牛奶。"]

MODELS = models_dir(A.models)
md = model_dir_with_big(MODELS, "paced-")

settings = Settings.from_env({"VOICE_NAME": "Big", "PRIMESPEECH_MODEL_DIR": md, "STREAMING": "true", "SEED": "1",
                              "TOP_K": "15", "TEXT_LANG": "all_zh", "GPTSVITS_WARMUP": "false",
                              "LOG_LEVEL": "WARNING", "PRIMESPEECH_ISA": os.environ.get("PRIMESPEECH_ISA", "auto"),
                              # the front end's dictionaries where this environment has them (else downloaded)
                              **{k: os.environ[k] for k in ("PRIMESPEECH_TEXT_DATA",) if os.environ.get(k)}})
engine, voice = engine_factory(settings)(lambda m: None)
engine.synthesize(SENTENCES[0])  # load and cache everything once


class Player:
    """The node's ``send``: audio arrival times and durations; the answered texts."""

    def __init__(self):
        self.cv = threading.Condition()
        self.audio: list[tuple[float, float]] = []
        self.completed = 0

    def __call__(self, output, array, metadata):
        now = time.perf_counter()
        with self.cv:
            if output == "audio":
                self.audio.append((now, float(metadata["duration"])))
                EVENTS.append((now, "audio", f"{metadata.get('question_id')} {float(metadata['duration']):.2f} s"))
            elif output == "segment_complete":
                self.completed += 1
            self.cv.notify_all()


EVENTS: list[tuple[float, str, str]] = []  # (clock, kind, what) for --trace
_admit = batching.Batching.admit


def traced_admit(self, request, s, timer):
    """``Batching.admit`` noting when a sentence joins, the rows then stepping and the batch's width."""
    t0 = time.perf_counter()
    row = _admit(self, request, s, timer)
    EVENTS.append((t0, "join", f"sentence {s} ({time.perf_counter() - t0:.2f} s), {len(self.batch.active)} rows"))
    return row


_cut = pacing.Pacer.cut


def traced_cut(self, new_tokens, now, deadline):
    """``Pacer.cut`` noting each window cut: its tokens, the audio in hand and the speeds the plan took."""
    cut = _cut(self, new_tokens, now, deadline)
    if cut:
        EVENTS.append((now, "cut", f"{new_tokens} tokens, in hand {max(0.0, (deadline or now) - now):.2f} s, "
                       f"token {self.token_s * 1e3:.1f} ms (batched {self.batched_token_s * 1e3:.1f}), frame "
                       f"{self.frame_s * 1e3:.2f} ms, latent {self.latent_s * 1e3:.0f} ms, slow {self.slow:.2f}, "
                       f"n_min {self.n_min}{', covering' if self.covering else ''}"))
    return cut


if A.trace:
    batching.Batching.admit = traced_admit
    pacing.Pacer.cut = traced_cut


def print_trace(name: str, t0: float, sent: list[float]) -> None:
    """The run's events from its first text: texts sent, joins, audio chunks with the gap before each."""
    rows = [(t - t0, "text", f"q{i}") for i, t in enumerate(sent)] + [(t - t0, k, w) for t, k, w in EVENTS]
    until = None
    for t, kind, what in sorted(rows):
        if kind == "audio":
            d = float(what.split()[1])
            gap = 0.0 if until is None else max(0.0, t - until)
            in_hand = 0.0 if until is None else max(0.0, until - t)
            until = max(t, until or t) + d
            what += f", in hand {in_hand:.2f} s" + (f", GAP {gap:.2f} s" if gap > 0 else "")
        print(f"TRACE {name} {t:7.2f} {kind:5} {what}", flush=True)


def parse_variant(spec: str):
    name, _, rest = spec.partition(":")
    return name, dict(item.split("=", 1) for item in rest.split(",") if item)


def one_run(opts: dict, name: str = "warm-up") -> dict:
    engine.settings = dataclasses.replace(engine.settings, batch=int(opts.get("batch", 4)))
    batching.ADMIT_QUEUED_S = float(opts.get("admit", base_admit))
    engine.pacing_plan = pacing.PacingOptions(join_while_covering=opts.get("join", "0") == "1")
    player = Player()
    handler = MessageHandler(settings, lambda progress: (engine, voice), DirectTransport(player))
    handler.start()
    assert handler.ready.wait(60) and handler.startup_error is None
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(A.sentences)]
    EVENTS.clear()
    t0 = time.perf_counter()
    sent = []
    before = engine.batching.batch
    steps0 = (id(before), before.steps, before.row_steps) if before is not None else (None, 0, 0)
    for i, t in enumerate(texts):
        delay = t0 + i * A.every - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent.append(time.perf_counter())
        handler.on_input("text", pa.array([t]), {"question_id": f"q{i}", "session_id": "paced"})
    with player.cv:
        assert player.cv.wait_for(lambda: player.completed == len(texts), 600), "not every text was answered"
    handler.finish(60)
    if A.trace and name != "warm-up":
        print_trace(name, t0, sent)
    arrivals = [a - t0 for a, _ in player.audio]
    durations = [d for _, d in player.audio]
    gaps, until = [], arrivals[0] + durations[0]
    for a, d in zip(arrivals[1:], durations[1:]):
        gaps.append(max(0.0, a - until))
        until = max(a, until) + d
    batch = engine.batching.batch  # a new batch when the width changed
    steps, rows = (batch.steps, batch.row_steps) if batch is not None else (0, 0)
    if batch is not None and id(batch) == steps0[0]:
        steps, rows = steps - steps0[1], rows - steps0[2]
    return {"first_audio_s": arrivals[0], "last_text_to_last_audio_s": arrivals[-1] - (sent[-1] - t0),
            "gap_total_s": sum(gaps), "gap_worst_s": max(gaps) if gaps else 0.0,
            "gaps": sum(g > 0 for g in gaps), "chunks": len(arrivals), "audio_s": sum(durations),
            "playback_end_s": until, "rows_per_step": rows / steps if steps else None}


base_admit = batching.ADMIT_QUEUED_S
variants = [parse_variant(v) for v in (A.variant or ["sequential:batch=1", "batched:batch=4"])]
for _name, opts in variants:
    one_run(opts)  # warm-up
results = {name: [] for name, _ in variants}
for _ in range(A.runs):
    for name, opts in variants:
        results[name].append(one_run(opts, name))
for name, opts in variants:
    runs = results[name]
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("first_audio_s", "last_text_to_last_audio_s", "gap_total_s", "gap_worst_s", "playback_end_s")}
    print("PACED " + json.dumps({"variant": name, "options": opts, "threads": A.threads, "sentences": A.sentences,
                                 "every_s": A.every, "loadavg": os.getloadavg()[0], "medians": med, "runs": runs},
                                default=str), flush=True)
