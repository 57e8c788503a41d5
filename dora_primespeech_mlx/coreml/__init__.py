"""CoreML (Apple Neural Engine) versions of the two encoders, CNHubert and Chinese RoBERTa.

* :mod:`.export` — torch-free MIL builders from the sanitized numpy weights, EnumeratedShapes buckets,
  ``.mlpackage`` writing and the per-model-dir package cache (runs on Linux too).
* :mod:`.runtime` — macOS prediction: compute units, compiled-model cache, pad to bucket, crop.
* :mod:`.interpreter` — a numpy MIL interpreter used by the tests to check the programs off macOS.
* :mod:`.cli` — the ``primespeech-mlx export-coreml`` sub-command.

The engine uses them through :class:`dora_primespeech_mlx.engine.encoders.EncoderBackends`, which falls back
to MLX per encoder. Nothing here imports coremltools at import time.
"""
