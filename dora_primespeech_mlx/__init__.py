"""dora_primespeech_mlx: GPT-SoVITS v2 text-to-speech for Dora, on MLX, without PyTorch.

Importing the package (or ``messages``, ``settings``, ``node``) has no side effects: the CPU BLAS is set up
when the engine or the models package is first imported, before MLX loads (see ``_blas``).
"""

__version__ = "0.1.0"
