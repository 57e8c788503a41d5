"""dora_primespeech_mlx: GPT-SoVITS v2 text-to-speech for Dora, on MLX, without PyTorch."""

from . import _blas

# Must run before anything imports mlx (see _blas.py): the Linux mlx wheel ships a reference BLAS.
_blas.preload()

__version__ = "0.1.0"
