"""What is loaded for a voice: its models (GPT, SoVITS, the encoders, the v2Pro speaker-verification model) and
its reference features, in one :class:`~.cache.VoiceCache`, loaded under the engine's
:class:`~..runtime.Runtime` through ``convert.load`` (the one loading path). The engine asks :class:`VoiceStore` for
a voice's
:class:`~.pipeline.Models` and :class:`~.reference.Reference`; a changed file is reloaded, a deleted one keeps
what was loaded from it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..assets.catalog import VoiceSpec
from ..convert import load
from ..errors import VoiceNotInstalledError
from ..models.shared.storage import trim_heap
from ..models.sovits import vocoder
from ..runtime import Runtime
from ..text.options import TextData
from . import pipeline, reference_cache
from .cache import VoiceCache, encoders_key, file_identity
from .encoders import EncoderBackends
from .reference import Reference, ReferenceBuilder
from .stats import EngineStats, Timer, stage


class VoiceStore:
    """A voice's models and reference features, cached per voice (see the module docstring)."""

    def __init__(self, runtime: Runtime, model_dir: Path, max_cached_voices: int, stats: EngineStats,
                 say: Callable[[str], None], keep_converted: int, text_data: TextData,
                 reference_cache: Path | None = None, prepared: Path | None = None):
        self.runtime, self.model_dir, self.stats, self.say = runtime, model_dir, stats, say
        self.reference_cache = reference_cache  # reference features on disk (engine/reference_cache.py); None: off
        self.prepared = prepared  # the models' prepared forms on disk (convert/load.py); None: off
        self.text_data = text_data  # the text front end's folders and g2pW choice (the reference text's phones)
        self.keep_converted = keep_converted  # per-request checkpoints kept converted (PRIMESPEECH_CONVERTED_CACHE)
        self.cache = VoiceCache(max_cached_voices, on_release=release_memory)
        self.references = ReferenceBuilder()

    def model(self, kind: str, path: Path, voice: str) -> Any:
        loader = {"gpt": load.load_gpt, "sovits": load.load_sovits, "hubert": load.load_hubert,
                  "bert": load.load_bert, "sv": load.load_sv}[kind]
        rt = self.runtime  # every load-time choice (the GPT decoder, BERT storage, the convolutions, the vocoder)

        def create():
            self.say(f"loading {kind} model {path}")
            with stage("load"):
                trim_after_request()  # what the work before left in the heap goes back before this model's peak
                model = loader(Path(path), root=self.model_dir, runtime=rt, keep_converted=self.keep_converted,
                               prepared=self.prepared)
                if kind == "sovits":  # the generator on ONNX Runtime where MLX runs on the CPU (sovits/vocoder.py)
                    model.use_vocoder(vocoder.from_runtime(model, rt, load.onnx_cache_dir(path, self.model_dir)))
                return model

        return self._cached(self.key(kind, file_identity(path)), voice, create)

    def _cached(self, key: tuple, voice: str, create: Callable[[], Any]) -> Any:
        """The cache's entry for ``key``, built here by ``create()`` when the cache leaves it to this store (the
        cache holds entries; what builds them stays in this module: no call from the cache back into it)."""
        found, value = self.cache.claim(key, voice)
        if found:
            return value
        try:
            value = create()
        except BaseException as exc:
            self.cache.fail(key, exc)
            raise
        return self.cache.fill(key, voice, value)

    def key(self, kind: str, identity: tuple) -> tuple:
        """The cache key of a file; a file deleted while running keeps the entry already loaded from it (the
        model in memory still works; a changed file gives a new key and a fresh load)."""
        if identity[-1] is None:
            for key in self.cache.keys(kind):
                if key[1][0] == identity[0]:
                    return key
        return (kind, identity)

    def models(self, spec: VoiceSpec) -> pipeline.Models:
        name = voice_id(spec)

        def encoders():
            return EncoderBackends(spec.hubert, spec.bert, runtime=self.runtime, root=self.model_dir,
                                   mlx_hubert=lambda: self.model("hubert", spec.hubert, name),
                                   mlx_bert=lambda: self.model("bert", spec.bert, name))

        sovits = self.model("sovits", spec.sovits, name)
        return pipeline.Models(
            gpt=self.model("gpt", spec.gpt, name),
            sovits=sovits,
            encoders=self._cached(encoders_key(spec.hubert, spec.bert), name, encoders),
            sv=self._sv_model(spec, sovits, name),
        )

    def _sv_model(self, spec: VoiceSpec, sovits, name: str):
        """The speaker-verification model a v2Pro / v2ProPlus voice needs (None for v1/v2)."""
        if not getattr(sovits, "needs_sv", False):
            return None
        if spec.sv is None or not Path(spec.sv).exists():
            raise VoiceNotInstalledError(
                f"voice {spec.name!r} is {sovits.args.version} and needs the speaker-verification model "
                f"(missing: {spec.sv}); download it with `primespeech-mlx download sv`")
        return self.model("sv", spec.sv, name)

    def reference(self, spec: VoiceSpec, models: pipeline.Models, prompt_lang: str, timer: Timer) -> Reference:
        files = (spec.reference, spec.gpt, spec.sovits, spec.hubert, *([spec.sv] if models.sv is not None else []))
        idents = [file_identity(p) for p in files]
        key = ("reference", (spec.name, *idents, str(spec.bert), spec.prompt_text, prompt_lang))
        if any(stamp is None for _, stamp in idents):  # files deleted while running: keep what was computed
            paths = [path for path, _ in idents]
            key = next((k for k in self.cache.keys("reference") if [i[0] for i in k[1][1:len(files) + 1]] == paths
                        and k[1][len(files) + 1:] == key[1][len(files) + 1:]), key)

        def create() -> Reference:
            disk = self._disk_key(spec, models, prompt_lang)
            if disk is not None:
                with stage("reference", timer):
                    ref = reference_cache.load(self.reference_cache, disk)
                if ref is not None:
                    self.say(f"reference features of voice {spec.name!r} from {self.reference_cache}")
                    return ref
            self.say(f"computing the reference features of voice {spec.name!r}")
            ref = self.references.build(spec, models, prompt_lang, timer, self.text_data)
            self.stats.count("reference_computations")
            if disk is not None:
                reference_cache.store(self.reference_cache, disk, ref)
            if self.runtime.trim_after_reference:  # CNHubert's temporaries, once per voice (README, "Memory")
                trim_after_request()
            return ref

        ref = self._cached(key, voice_id(spec), create)
        self.cache.discard("reference", voice_id(spec), keep=key)  # an edited voice's old features
        return ref

    def _disk_key(self, spec: VoiceSpec, models: pipeline.Models, prompt_lang: str) -> str | None:
        """The on-disk cache key of ``spec``'s reference features; None when that cache is off or a file cannot be
        read (the build then says what is wrong)."""
        if self.reference_cache is None:
            return None
        try:
            return reference_cache.reference_key(spec, prompt_lang, models.symbol_version, models.sv is not None,
                                                 self.runtime, self.text_data)
        except OSError:
            return None


def release_memory() -> None:
    """After models were dropped: collect them and hand MLX's cached buffers and the freed heap back to the OS."""
    import gc

    gc.collect()
    trim_after_request()


def trim_after_request() -> None:
    """At the end of a request: MLX's cached buffers and the heap's free pages back to the OS.

    A synthesis frees its temporaries (numpy, ONNX Runtime, MLX) inside the heap, where glibc keeps them; the trim
    gives them back for a few milliseconds (``malloc_trim`` walks the heap) once the audio has been delivered
    (docs/memory.md, "End-of-request trim")."""
    mx.clear_cache()
    trim_heap()


def voice_id(spec: VoiceSpec) -> str:
    """A voice's identity in the cache: its name and files (every ``VOICE:CUSTOM``/``TRAINED`` voice is named
    alike, but their files differ)."""
    return "|".join(map(str, (spec.name, spec.gpt, spec.sovits, spec.reference, spec.hubert, spec.bert)))

