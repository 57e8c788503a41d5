"""pytest plugin of the GPU check (``-p gpu_plugin``): puts MLX on the device the check names and writes one JSON
line per test: the variant, the outcome, the seconds, and the error lines the fixture tests print beside their
tolerances ("max_abs_err ... tol ..."), so a summary can name each path's error without re-deriving it.

Environment: ``PRIMESPEECH_CHECK_DEVICE`` (gpu | cpu), ``PRIMESPEECH_CHECK_JSONL`` (file appended to),
``PRIMESPEECH_CHECK_VARIANT`` (the name written on each line).
"""

from __future__ import annotations

import json
import os
import re

ERROR_LINE = re.compile(r"err|tol", re.IGNORECASE)


def pytest_configure(config):
    import mlx.core as mx

    device = os.environ.get("PRIMESPEECH_CHECK_DEVICE", "gpu")
    if device == "gpu" and not mx.is_available(mx.gpu):
        raise RuntimeError("PRIMESPEECH_CHECK_DEVICE=gpu but this MLX build has no GPU backend (is mlx-cuda there?)")
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)


def error_lines(text: str) -> list[str]:
    """The printed lines that report an error against a tolerance."""
    return [line.strip() for line in text.splitlines() if line.strip() and ERROR_LINE.search(line)]


def pytest_runtest_logreport(report):
    path = os.environ.get("PRIMESPEECH_CHECK_JSONL")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return  # one line per test: its call, or the setup/teardown that did not pass
    row = {"phase": "fixtures", "variant": os.environ.get("PRIMESPEECH_CHECK_VARIANT", ""), "test": report.nodeid,
           "when": report.when, "outcome": report.outcome, "seconds": round(report.duration, 3),
           "errors": error_lines(report.capstdout)}
    if report.outcome == "failed":
        row["message"] = str(report.longrepr).strip().splitlines()[-1][:400] if report.longrepr else ""
    elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        row["message"] = str(report.longrepr[2])[:200]
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
