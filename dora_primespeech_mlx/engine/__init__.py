"""The synthesis engine: voice -> reference features -> text -> GPT -> SoVITS -> audio.

Modules, each owning one concern:

- ``config``: request settings (:class:`SynthesisConfig`) and results (:class:`SynthesisResult`, :class:`AudioChunk`);
- ``cache``: one LRU cache of everything loaded for a voice (models, encoders, reference features);
- ``store``: what a voice loads (its models through ``convert.load``, its reference), kept in that cache;
- ``reference``: a voice's prompt side (``ge``, prompt tokens, prompt phones and BERT);
- ``pipeline``: one request's way through the models (text chunks, GPT tokens, SoVITS audio, noise);
- ``stream``: one streamed request behind one seam (``EnginePorts``), its stages ``batching``, ``pacing``, ``rates``,
  ``streaming`` and ``overlap``; its one public entry is ``GPTSoVITSEngine.synthesize_stream``;
- ``stats`` / ``backends``: timings, counters and what runs where;
- ``core``: :class:`GPTSoVITSEngine`, the public API tying them together.

The CPU BLAS is set up here, before MLX is first loaded (see ``_blas``).
"""

from .. import _blas

_blas.preload()

from .config import TEXT_SPLIT_METHODS, AudioChunk, SynthesisConfig, SynthesisResult  # noqa: E402
from .core import GPTSoVITSEngine  # noqa: E402

__all__ = ["TEXT_SPLIT_METHODS", "AudioChunk", "GPTSoVITSEngine", "SynthesisConfig", "SynthesisResult"]
