"""G2P speed of the text front end per language option: ``python -m dora_primespeech_mlx.bench.text_g2p``.

For every language option found in the given JSONL files (the text fixtures' layout: ``text`` and
``language`` per line; cases where upstream raised are left out) it reports the one-off load time
(first call: libraries, dictionaries) and then milliseconds per sentence for :func:`get_phones` over
all sentences of that option, ``--repeat`` passes, min and median of the per-pass means. Without files
it uses a few built-in sentences per language. Numbers, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from ..text.frontend import get_phones
from ..text.options import TextData
from .measure import bench_text_data

SAMPLES = {
    "all_zh": ["今天是2024年3月15日，我用了3个小时写程序。", "你好，很高兴认识你！"],
    "en": ["Hello, how are you doing today?", "The meeting starts at 10:30 on Monday."],
    "all_ja": ["今日は2024年3月15日です。", "私はあなたのアシスタントです、何かお手伝いできることはありますか？"],
    "all_ko": ["안녕하세요. 오늘은 2024년 3월 15일입니다.", "사과 3개와 우유 2잔을 샀어요!"],
    "all_yue": ["你好，我係你嘅助手。", "今日係2024年3月15號，天氣幾好呀！"],
}


def load_cases(paths: list[Path]) -> dict[str, list[str]]:
    by_option: dict[str, list[str]] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                row = json.loads(line)
                if "error" not in row:
                    by_option.setdefault(row["language"], []).append(row["text"])
    return by_option


def bench(by_option: dict[str, list[str]], repeat: int, data: TextData) -> list[dict]:
    rows = []
    for option, texts in by_option.items():
        start = time.perf_counter()
        get_phones(texts[0], option, data=data)
        load_s = time.perf_counter() - start
        for text in texts:  # warm-up pass
            get_phones(text, option, data=data)
        means = []
        for _ in range(repeat):
            start = time.perf_counter()
            for text in texts:
                get_phones(text, option, data=data)
            means.append((time.perf_counter() - start) * 1000 / len(texts))
        chars = sum(len(t) for t in texts) / len(texts)
        rows.append({
            "option": option, "sentences": len(texts), "mean_chars": round(chars, 1), "load_s": round(load_s, 2),
            "ms_per_sentence_min": round(min(means), 2), "ms_per_sentence_median": round(statistics.median(means), 2),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("files", nargs="*", type=Path,
                   help="JSONL files with text/language per line (default: built-in samples)")
    p.add_argument("-n", "--repeat", type=int, default=5, help="timed runs per sentence (default: 5)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    rows = bench(load_cases(args.files) if args.files else SAMPLES, max(1, args.repeat), bench_text_data())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"text front end G2P speed (get_phones), {args.repeat} passes, 1-min load average {load:.1f}")
    print(f"{'option':<9} {'sentences':>9} {'chars':>6} {'load s':>7} {'ms/sentence min':>16} {'median':>7}")
    for r in rows:
        print(
            f"{r['option']:<9} {r['sentences']:>9} {r['mean_chars']:>6} {r['load_s']:>7} "
            f"{r['ms_per_sentence_min']:>16} {r['ms_per_sentence_median']:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
