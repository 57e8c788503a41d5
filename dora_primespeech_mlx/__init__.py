"""dora_primespeech_mlx: GPT-SoVITS v2 text-to-speech for Dora, on MLX, without PyTorch."""

__version__ = "0.1.0"
