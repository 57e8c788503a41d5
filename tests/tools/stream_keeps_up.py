"""Does streaming keep up? After the first chunk, is every chunk ready before the previous one has finished playing?

``python tests/tools/stream_keeps_up.py --threads 1 [--runs 3] [--text TEXT] [--split cut5] [--models $REF_BIG]``

Uses the real-size random-weight set of the compare tools (``$REF_BIG``, see shared/tools/compare/README.md;
its reference wave is written by the first ``sidebyside.py upstream`` run) through the public engine API, like
``sidebyside.py ours``. A player starts each chunk when it has arrived and the previous one has finished
playing; the margin of chunk i (i >= 1) is the time the previous chunk finishes playing minus chunk i's
arrival (negative = an audible gap of that length, after which playback goes on from the late chunk). The
worst (smallest) margin is printed per run, with every margin and the arrival times. One warm-up run, then
``--runs`` timed runs; prints one ``KEEPSUP {json}`` line (with the engine's ``stream_rates``: the speeds the
pacer planned by). Not a test.

Levers side by side: ``--variant NAME:key=value,...`` (repeatable) runs each variant in turn within every round
(alternating, so they share the machine's state); keys are SynthesisConfig settings (``stream_first_tokens=20``,
``stream_ramp=1``, ``stream_pace=0``: the fixed steps instead of the paced windows) plus ``overlap=0|1|auto``
(PRIMESPEECH_OVERLAP) and ``crop=0`` (vocode whole windows, as before the receptive-field crop) and ``bert_all=1``
(a stream computes every sentence's BERT before its first audio, as before) and ``parts=1|2`` (the ONNX Runtime
vocoder as one run with ``--threads`` intra-op threads, or cut into that many single-threaded runs at once) and
``gpt_yield=0`` (the GPT keeps its threads while the lane works) and ``blas_hold=0`` (the BLAS keeps its
threads while the lane works) and ``follow=0`` (a window is vocoded in turn while little audio is queued even where
the stream's earlier windows are still in the lane) and ``length=0`` (the pacer expects no sentence
length) and ``slowdown=0`` (the pacer ignores how much longer than estimated windows took) and ``join=1`` (later
sentences join the decode also while the pacer covers) and ``taper=0`` (while covering, windows of
``stream_chunk_tokens`` to the sentence's end instead of shrinking ones) and ``later=0`` (while covering, a later
sentence's first piece is the smallest that keeps up, even with audio in hand) and ``endwait=0`` (a window ending at
the sentence's expected length is cut without waiting a step for its end) and ``cover_later=0`` (windows that gain on
the listener never cover for the later sentences' starts) and ``start=earliest`` (the first sentence's first chunk
as early as that sentence alone allows: PRIMESPEECH_STREAM_START) and ``live=0`` (the plan on the recent medians
alone, not the sentence's live token speed) and ``max_wait=S`` (PRIMESPEECH_STREAM_MAX_WAIT; these are
``pacing.PacingOptions``). Prints one
``KEEPSUP`` line per variant;
``--whole`` also times a whole (non-streaming) request after each streamed one.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--text", default="今天的天气特别好，我们一起去公园里散步聊天吧。")
ap.add_argument("--split", default="cut0")
ap.add_argument("--models", default=None)
ap.add_argument("--variant", action="append", default=[])
ap.add_argument("--whole", action="store_true", help="with --variant: also time whole (non-streaming) requests")
A = ap.parse_args()
os.environ["PRIMESPEECH_THREADS"] = str(A.threads)

from ref_big import model_dir_with_big, models_dir  # noqa: E402

from dora_primespeech_mlx.engine import GPTSoVITSEngine, core, pacing  # noqa: E402

MODELS = models_dir(A.models)
md = model_dir_with_big(MODELS, "keepsup-")
eng = GPTSoVITSEngine(model_dir=md)
eng.load_voice("Big")
kw = dict(voice="Big", text_lang="all_zh", text_split_method=A.split, top_k=15, seed=1, speed_factor=1.0)


def parse_variant(spec: str):
    name, _, rest = spec.partition(":")
    opts = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, opts


def apply_variant(opts: dict) -> dict:
    """Set the engine-level switches of a variant; returns its request settings."""
    from dora_primespeech_mlx.models.sovits.hifigan import Generator

    opts = dict(opts)
    eng.runtime = eng.runtime.replace(overlap=opts.pop("overlap", base_overlap),
                                      follow_busy_lane=opts.pop("follow", "1") != "0")
    parts = opts.pop("parts", None)
    if parts is not None:  # the ONNX Runtime vocoder whole (intra-op threads) or cut per thread
        backend = eng.store.models(eng.voice).sovits.vocoder_backend
        backend.generator, backend.split = vocoders[parts]
    hold = opts.pop("blas_hold", "1") != "0"  # the runtime's hold_blas
    yields = opts.pop("gpt_yield", "1") != "0"
    eng._lane.on_busy = functools.partial(core._lane_busy, eng.threads, hold) if yields else None
    rates = eng.rates  # the pacer's inputs: instance attributes shadow the methods for this variant only
    rates.__dict__.pop("expected_tokens", None)
    if opts.pop("length", "1") == "0":
        rates.expected_tokens = lambda voice, phones: None
    slowdown = opts.pop("slowdown", "1") != "0"
    type(rates).slowdown = base_slowdown if slowdown else property(lambda self: 1.0)
    crop = opts.pop("crop", "1") != "0"
    eng.pacing_plan = pacing.PacingOptions(bert_first=opts.pop("bert_all", "0") != "1",
                                           join_while_covering=opts.pop("join", "0") == "1",
                                           taper=opts.pop("taper", "1") != "0",
                                           later_full=opts.pop("later", "1") != "0",
                                           cover_later=opts.pop("cover_later", "1") != "0",
                                           end_waits=opts.pop("endwait", "1") != "0",
                                           start=opts.pop("start", "gapless"),
                                           live=opts.pop("live", "1") != "0",
                                           max_wait_s=float(opts.pop("max_wait", "0")))
    Generator.receptive_frames = base_reach if crop else property(lambda self: 10**6)
    if not crop:
        opts["stream_vocoder_margin"] = "4096"  # every frame of each window through the vocoder
    return {k: (v not in ("0", "false") if k == "stream_pace" else float(v) if "." in v else int(v))
            for k, v in opts.items()}


def one_run(extra=None):
    t0 = time.perf_counter()
    arrivals, durations = [], []
    for chunk in eng.synthesize_stream(A.text, **kw, **(extra or {})):
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
            "durations_s": [round(d, 3) for d in durations], "total_s": time.perf_counter() - t0}


if A.variant:
    from dora_primespeech_mlx.models.sovits.hifigan import Generator

    base_overlap, base_reach = eng.runtime.overlap, Generator.receptive_frames
    base_slowdown = type(eng.rates).slowdown
    variants = [parse_variant(v) for v in A.variant]
    vocoders = {}
    if any("parts" in opts for _, opts in variants):
        from dora_primespeech_mlx.models.sovits import vocoder

        sovits = eng.store.models(eng.voice).sovits
        cache = sovits.vocoder_backend.generator.path.parent
        for value in {opts["parts"] for _, opts in variants if "parts" in opts}:  # as the engine builds them
            backend = vocoder.build(sovits, cache, mode="onnx", threads=A.threads, release_mlx=False, parts=value)
            vocoders[value] = (backend.generator, backend.split)
    results = {name: [] for name, _ in variants}
    for _name, opts in variants:  # warm-up of each
        one_run(apply_variant(opts))
    for _ in range(A.runs):
        for name, opts in variants:
            extra = apply_variant(opts)
            results[name].append(one_run(extra))
            if A.whole:
                t0 = time.perf_counter()
                eng.synthesize(A.text, **kw, **extra)
                results[name][-1]["whole_s"] = time.perf_counter() - t0
    for name, opts in variants:
        runs = results[name]
        worst = [r["worst_margin_s"] for r in runs if r["worst_margin_s"] is not None]
        print("KEEPSUP " + json.dumps({
            "variant": name, "options": opts, "threads": A.threads, "split": A.split, "loadavg": os.getloadavg()[0],
            "first_s_median": statistics.median(r["first_s"] for r in runs),
            "total_s_median": statistics.median(r["total_s"] for r in runs),
            "whole_s_median": statistics.median(r["whole_s"] for r in runs) if A.whole else None,
            "worst_margin_s_min": min(worst) if worst else None,
            "worst_margin_s_median": statistics.median(worst) if worst else None,
            "stream_rates": eng.stats().get("stream_rates"), "runs": runs}, ensure_ascii=False, default=str))
    raise SystemExit(0)

one_run()  # warm-up
runs = [one_run() for _ in range(A.runs)]
worst = [r["worst_margin_s"] for r in runs if r["worst_margin_s"] is not None]
print("KEEPSUP " + json.dumps({"threads": A.threads, "split": A.split, "text": A.text, "loadavg": os.getloadavg()[0],
                               "worst_margin_s_min": min(worst) if worst else None,
                               "worst_margin_s_median": statistics.median(worst) if worst else None,
                               "backends": eng.stats().get("backends"),
                               "stream_rates": eng.stats().get("stream_rates"), "runs": runs}, ensure_ascii=False,
                              default=str))
