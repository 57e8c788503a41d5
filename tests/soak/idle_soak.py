"""Does the shipped dataflow survive silence? (issue 10, item 8a; a soak script, not a unit test)

Runs the shipped dataflow.yaml (TTS node with the tiny fixture voice, nodes/text_source.py, nodes/wav_sink.py)
under a real ``dora run``, the source speaking ``--texts`` texts with ``--idle`` seconds (default 180) of
silence between them, twice at the same time: as shipped, and as a control with every
``finish_grace_secs`` removed (dora 1.1 then stops the flow after ~120 s of silence). Prints, per run,
dora's exit code, whether dora escalated a stop, and the answer each text got.

    python tests/soak/idle_soak.py [--idle 180] [--texts 3] [--no-control]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from shipped_flow import dora_run, finish, shipped_flow


def run(work: Path, texts: int, idle: float, keep_grace: bool) -> dict:
    lines = []
    for i in range(texts):
        if i:
            lines.append(f"@sleep {idle}")
        lines.append(f"Hello world, this is text number {i + 1}.")
    work.mkdir(parents=True)
    flow = shipped_flow(work, source_env={"SCRIPT": "\n".join(lines) + "\n"}, keep_grace=keep_grace)
    t0 = time.monotonic()
    rc, out = finish(dora_run(flow), timeout=idle * texts + 300)
    (work / "dora.log").write_text(out, encoding="utf-8")
    report_path = work / "out" / "report.json"
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else {}
    answers = [(s.get("text"), s.get("outcome")) for s in report.get("segments", []) if s.get("text")]
    return {"rc": rc, "escalated": "escalating stop" in out, "seconds": round(time.monotonic() - t0),
            "answers": answers, "completed": sum(o == "completed" for _, o in answers), "log": str(work)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=float, default=180.0)
    ap.add_argument("--texts", type=int, default=3)
    ap.add_argument("--no-control", action="store_true", help="only the shipped flow")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="idle-soak-"))
    variants = {"shipped": True} if args.no_control else {"shipped": True, "control (no grace)": False}
    results: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda n=n, g=g: results.__setitem__(
        n, run(root / n.split()[0], args.texts, args.idle, g))) for n, g in variants.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"idle soak: {args.texts} texts, {args.idle:.0f} s of silence between them; work folder {root}")
    ok = True
    for name, r in results.items():
        print(f"{name:20} rc={r['rc']} escalated={r['escalated']} completed={r['completed']}/{args.texts} "
              f"seconds={r['seconds']}")
        for text, outcome in r["answers"]:
            print(f"    {outcome!s:10} {text}")
        if name == "shipped":
            # (dora's exit code also reflects how the nodes exited at the end, reported above)
            ok = r["completed"] == args.texts and not r["escalated"]
    print("shipped dataflow survived the silence" if ok else "shipped dataflow did NOT survive the silence")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
