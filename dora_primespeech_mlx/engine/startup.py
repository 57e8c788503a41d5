"""Starting an engine from the settings, as the node does: resolve the start voice (downloading a preset voice that
is not installed, when ``PRIMESPEECH_AUTO_DOWNLOAD`` allows), load the text front ends and freeze the collector,
load the voice and warm up, reporting progress as it goes. :func:`start_engine` is the whole sequence."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import replace

from ..assets.catalog import VoiceSpec, catalog_options, resolve_voice
from ..assets.download import download_voice
from ..errors import VoiceNotInstalledError
from ..settings import Settings
from ..text.options import TextData
from ..text.warmup import warm_up
from .config import SynthesisConfig
from .core import GPTSoVITSEngine
from .encoders import prepare_coreml

Progress = Callable[[str], None]


def start_voice(settings: Settings, progress: Progress) -> VoiceSpec:
    """The start voice (``VOICE_NAME``), downloaded first when it is a preset voice that is not installed and
    ``PRIMESPEECH_AUTO_DOWNLOAD`` is on; ``TEXT_LANG``, ``PROMPT_LANG`` and ``PROMPT_TEXT`` override its own."""
    where = catalog_options(settings)  # PRIMESPEECH_VOICES_DIR, PRIMESPEECH_VOICE_UNKNOWN_KEYS
    try:
        spec = resolve_voice(settings.voice, settings.model_dir, **where)
    except VoiceNotInstalledError:
        spec = resolve_voice(settings.voice, settings.model_dir, require_installed=False, **where)
        if not (settings.auto_download and spec.source == "preset"):
            raise
        progress(f"voice {spec.name} is not installed: downloading it into {settings.model_dir} "
                 "(PRIMESPEECH_AUTO_DOWNLOAD=false turns this off) ...")
        download_voice(spec.name, settings.model_dir, after_convert=prepare_coreml)
        spec = resolve_voice(settings.voice, settings.model_dir, **where)
    start = {k: v for k, v in (("language", settings.text_lang), ("prompt_lang", settings.prompt_lang),
                               ("prompt_text", settings.prompt_text)) if v is not None}
    return replace(spec, **start) if start else spec


def start_engine(settings: Settings, progress: Progress) -> tuple[GPTSoVITSEngine, VoiceSpec]:
    """Build the engine, load the start voice and warm up (``GPTSVITS_WARMUP``): ``(engine, voice)``.

    ``progress`` may carry ``text_waiting`` (a ``threading.Event``, the node's: set once a text is queued): the
    warm-up synthesis is then cut short, or skipped, as soon as it is set (:meth:`GPTSoVITSEngine.warmup`), so a
    text sent during the start-up waits for the models, not for the warm-up."""
    spec = start_voice(settings, progress)
    config = SynthesisConfig().replace(**settings.sampling())
    progress(f"loading voice {spec.name} (device {settings.device}, encoders {settings.encoders}) ...")
    t0 = time.perf_counter()
    engine = GPTSoVITSEngine(config=config, progress=progress, settings=settings)  # its runtime: the settings'
    freeze_front_ends(spec.language if settings.warmup else None, progress,  # (the engine loads no model yet)
                      engine.text_data)
    engine.load_voice(spec)
    progress(f"voice {spec.name} loaded in {time.perf_counter() - t0:.1f} s")
    if settings.warmup:
        t0 = time.perf_counter()
        waiting = getattr(progress, "text_waiting", None)
        front_ends = engine.warmup(cancel=waiting)
        detail = ", ".join(f"{lang} {s:.1f} s" for lang, s in front_ends.items())
        cut = " (its synthesis cut short: a text is waiting)" if waiting is not None and waiting.is_set() else ""
        progress(f"warm-up done in {time.perf_counter() - t0:.1f} s{cut} (text front ends: {detail})")
    return engine, spec


def freeze_front_ends(language: str | None, progress: Progress, data: TextData) -> None:
    """Load the text front ends ``language`` needs (None: none now; ``data``: the engine's folders), then move
    every object alive into the collector's permanent generation (``gc.freeze``).

    Why: the front ends' dictionaries are ~600 000 Python lists that live as long as the process, and a full
    collection walks them all while holding the GIL (docs/languages.md, "Speed and first load"): every model load
    (``convert.load``), every voice eviction and Python's own occasional full collections would stall the input
    thread (``stats``, ``reset``, STOP) that long. Frozen objects are never collected as cycles, so this runs
    before any model is loaded (a GPT holds a reference cycle and must stay collectable when a voice is
    dropped); objects freed by reference counting are freed as usual."""
    if language is not None:
        t0 = time.perf_counter()
        front_ends = warm_up(language, data=data)
        detail = ", ".join(f"{lang} {s:.1f} s" for lang, s in front_ends.items())
        progress(f"text front ends loaded in {time.perf_counter() - t0:.1f} s ({detail})")
    gc.collect()
    gc.freeze()
