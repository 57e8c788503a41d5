"""The real-size random-weight set of the compare tools as a voice "Big" in a temporary model folder (for the tools
in this folder; see shared/tools/compare/README.md for ``$REF_BIG``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import yaml


def models_dir(given: str | None = None) -> str:
    """``given``, else ``$REF_BIG``, else the compare tools' default folder."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.abspath(given or os.environ.get("REF_BIG", os.path.join(base, "primespeech-ref", "ref-big")))


def model_dir_with_big(models: str, prefix: str) -> str:
    """A temporary model folder whose ``voices/Big/voice.yaml`` points at ``models``; removed at exit with the
    converted models (~2 GB)."""
    md = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, md, True)
    os.makedirs(os.path.join(md, "voices", "Big"))
    with open(os.path.join(md, "voices", "Big", "voice.yaml"), "w") as f:
        yaml.safe_dump({"name": "Big", "language": "zh", "prompt_text": "这是一段用于测试的参考音频。",
                        "prompt_lang": "zh", "speed_factor": 1.0, "reference": os.path.join(models, "ref_5s_32k.wav"),
                        "gpt": os.path.join(models, "gpt", "s1-v2-random.ckpt"),
                        "sovits": os.path.join(models, "sovits", "s2G-v2-random.pth"),
                        "hubert": os.path.join(models, "chinese-hubert-base"),
                        "bert": os.path.join(models, "chinese-roberta-wwm-ext-large")}, f, allow_unicode=True)
    return md
