"""How one engine runs its models, resolved once: :class:`Runtime`.

The engine builds a :class:`Runtime` from its :class:`~.settings.Settings` when it is constructed
(:meth:`Runtime.from_settings`) and hands it to everything that loads or runs a model (``convert.load``,
``engine.store``, ``engine.encoders``, ``coreml.runtime``, the models' CPU paths). Nothing below the entry points
reads the environment or keeps a process-wide switch for these choices, so two engines with different runtimes
run side by side in one process. Benchmarks and tests build the runtime they want (``Runtime(vocoder="mlx")``,
``runtime.replace(fused_step=False)``).

Process-wide by nature, hence not here: the CPU BLAS library (loaded into the global symbol scope before MLX loads,
``_blas``; its thread count is set by the engine's thread plan, ``threads``, the runtime's ``threads`` field), the
folder and compiler of the native builds (``native``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .threads import ThreadPlan

CHOICES: dict[str, tuple[str, ...]] = {
    "device": ("auto", "cpu", "gpu"),
    "encoders": ("auto", "coreml", "mlx"),
    "coreml_compute_units": ("CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"),
    "t2s_decode": ("auto", "mlx", "compile", "numpy"),
    "gpt_half": ("auto", "1", "0"),
    "gpt_prefill": ("auto", "float16", "float32"),
    "precision": ("exact", "int8", "bf16", "int8_bf16"),
    "bert_gemm": ("auto", "float16", "float32"),
    "isa": ("auto", "avx512", "avx2", "generic", "none"),
    "conv_impl": ("auto", "gemm", "native"),
    "vocoder": ("auto", "onnx", "openvino", "mlx"),
    "vocoder_parts": ("auto", "1", "2", "3", "4", "6", "8"),
    "overlap": ("auto", "1", "0"),
}
FROM_SETTINGS = ("device", "encoders", "coreml_compute_units", "t2s_decode", "t2s_compile", "gpt_half",
                 "gpt_prefill", "precision", "bert_half", "bert_gemm", "isa", "conv_impl", "vocoder", "vocoder_parts",
                 "vocoder_spin", "overlap")


@dataclass(frozen=True)
class Runtime:
    """Where and how the models run. The defaults are the settings' defaults (``auto``: chosen for this machine
    when the model loads); the fields without a setting are levers benchmarks and tests pull."""

    device: str = "auto"  # MLX device: auto | cpu | gpu
    encoders: str = "auto"  # CNHubert / RoBERTa backend: auto (CoreML on macOS when available) | coreml | mlx
    coreml_compute_units: str = "CPU_AND_NE"
    t2s_decode: str = "auto"  # GPT decode step: auto | mlx | compile | numpy (models/gpt/decode.py)
    t2s_compile: bool | None = None  # mx.compile the MLX step (None: on GPUs)
    gpt_half: str = "auto"  # the GPT's numpy step on float16 weights: auto | 1 | 0
    gpt_prefill: str = "auto"  # GPT prefill with float16 weights: auto | float16 | float32 (kernels/cpu_paths.py)
    precision: str = "exact"  # reduced precision, opt-in: exact | int8 (GPT decode step, models/kernels/q8.py) | bf16
    # (vocoder on OpenVINO in bfloat16, models/sovits/vocoder_openvino.py) | int8_bf16 (both)
    bert_half: bool | None = None  # RoBERTa weights in float16 (None: automatic)
    bert_gemm: str = "auto"  # RoBERTa with float16 weights: auto | float16 | float32
    isa: str = "auto"  # build of the float16 kernels: auto | avx512 | avx2 | generic | none
    fused_step: bool = True  # float16 weights: the GPT step's blocks and prefill attention in one kernel call each
    conv_impl: str = "auto"  # SoVITS convolutions: auto | gemm | native (models/sovits/conv.py)
    vocoder: str = "auto"  # SoVITS generator: auto | onnx | openvino | mlx (models/sovits/vocoder.py)
    vocoder_parts: str = "auto"  # ONNX Runtime vocoder cut into this many stretches
    vocoder_spin: bool | None = None  # ONNX Runtime's intra-op threads spin between convolutions (None: off)
    vocoder_arena: bool = False  # ONNX Runtime's CPU memory arena
    release_mlx: bool = True  # drop the MLX generator weights while ONNX Runtime serves it (read back on demand)
    overlap: str = "auto"  # ONNX Runtime vocoder on a thread beside the GPT: auto | 1 | 0 (engine/overlap.py)
    hold_blas: bool = True  # the BLAS keeps to one thread while the vocoder lane works
    follow_busy_lane: bool = True  # a stream's window goes to the lane also while its earlier windows are there
    trim_after_reference: bool = True  # hand the heap back after a voice's reference features
    decoder_at_load: bool = True  # build the numpy GPT decoder's weights while loading
    # the engine's thread counts (threads.ThreadPlan; the engine makes one from its settings where this is None)
    threads: Any = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        bad = [f"{name}={getattr(self, name)!r} (expected one of {', '.join(values)})"
               for name, values in CHOICES.items() if getattr(self, name) not in values]
        if bad:
            raise ConfigError("invalid runtime: " + "; ".join(bad))

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> Runtime:
        """The runtime the settings ask for (:data:`FROM_SETTINGS` fields), with ``overrides`` applied."""
        values = {name: getattr(settings, name) for name in FROM_SETTINGS}
        values["threads"] = ThreadPlan.from_settings(settings)
        values.update(overrides)
        return cls(**values)

    def reduced(self, part: str) -> bool:
        """Whether ``precision`` asks for the reduced-precision ``part`` (``int8``: the GPT decode step; ``bf16``:
        the vocoder)."""
        return part in self.precision.split("_")

    def replace(self, **changes: Any) -> Runtime:
        """A copy with ``changes`` (checked like a new one)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """Every field, for ``stats()`` and the bench (the thread plan as its own description)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["threads"] = self.threads.describe() if self.threads is not None else None
        return out


DEFAULT = Runtime()
