"""A burst of short texts through the shipped dataflow (issue 10, item 4; a script, not a unit test).

The shipped dataflow.yaml (its queue sizes as shipped) with the TTS node speaking the tiny fixture voice;
the text source is replaced by tests/soak/loss_nodes.py ``src``, which waits for the node's ``ready``
status, sends ``--texts`` short texts at once and counts the ``segment_complete``s that come back (and
whether in order); nodes/wav_sink.py records everything as shipped. The TTS node's RSS is sampled every
0.5 s. Prints texts sent, answers received (src and wav_sink), order, RSS before the burst / at its peak /
at the end, and the time taken.

    python tests/soak/burst.py [--texts 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from shipped_flow import HERE, dora_run, finish, rss_mb, shipped_flow, wait_pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--settle", type=float, default=60.0, help="seconds without an answer before giving up")
    ap.add_argument("--no-overlay", action="store_true",
                    help="run without DORA_ZENOH_CONFIG_OVERLAY (the README recommends it for the whole dataflow)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="burst-"))
    flow = shipped_flow(work, source={"path": str(HERE / "loss_nodes.py")},
                        source_env={"ROLE": "src", "TEXTS": str(args.texts), "BURST": "1", "WAIT_READY": "1",
                                    "SETTLE": str(args.settle), "RESULT_DIR": str(work)})
    from dora_primespeech_mlx.settings import ZENOH_OVERLAY

    proc = dora_run(flow, None if args.no_overlay else {"DORA_ZENOH_CONFIG_OVERLAY": str(ZENOH_OVERLAY)})
    samples: list[tuple[float, float]] = []
    pid = wait_pid(proc)

    def sample():
        while pid and proc.poll() is None:
            mb = rss_mb(pid)
            if mb is None:
                return
            samples.append((time.time(), mb))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc, out = finish(proc, timeout=args.texts * 2 + 600)
    sampler.join(timeout=2)
    (work / "dora.log").write_text(out, encoding="utf-8")
    src = json.loads((work / "src.json").read_text()) if (work / "src.json").exists() else {}
    started = float((work / "started").read_text()) if (work / "started").exists() else None
    report_path = work / "out" / "report.json"
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else {}
    sink_answers = sum(len(q.get("segment_complete", [])) for q in report.get("questions", {}).values())
    outcomes: dict[str, int] = {}
    for q in report.get("questions", {}).values():
        for o in q.get("segment_complete", []):
            outcomes[o] = outcomes.get(o, 0) + 1
    before = [mb for t, mb in samples if started and t <= started]
    print(f"burst: {args.texts} texts at once through the shipped dataflow.yaml (tiny voice); work folder {work}")
    print(f"  dora run exit code     {rc}")
    print(f"  answers at the source  {src.get('answered')} of {src.get('texts')} "
          f"(unique {src.get('unique')}, in order {src.get('in_order')}), {src.get('seconds')} s")
    print(f"  answers at wav_sink    {sink_answers} {outcomes}")
    if src.get("missing"):
        print(f"  first missing ids      {src['missing'][:20]}")
    if samples:
        print(f"  node RSS               before {before[-1] if before else float('nan'):.0f} MB, "
              f"peak {max(mb for _, mb in samples):.0f} MB, last {samples[-1][1]:.0f} MB ({len(samples)} samples)")
    warn = out.count("Discarding event")
    print(f"  dora 'Discarding event' warnings: {warn}")
    return 0 if src.get("answered") == args.texts and src.get("in_order") else 1


if __name__ == "__main__":
    sys.exit(main())
