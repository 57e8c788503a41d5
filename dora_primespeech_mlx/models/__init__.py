"""The models, a folder per network: ``gpt`` (text to semantic tokens), ``sovits`` (tokens to audio, with its
vocoder backends), ``hubert`` and ``bert`` (the encoders), ``sv`` (v2Pro speaker verification); the pieces they share
in ``shared``, the float16 kernels' Python side in ``kernels``, audio helpers in ``audio``. Each network's math is in
its ``model`` module, its other runtime implementations beside it, chosen in one place per network from the engine's
:class:`~dora_primespeech_mlx.runtime.Runtime`. Importing this package first sets up the CPU BLAS that MLX links (see
``_blas``): it must happen before ``mlx`` loads."""

from .. import _blas

_blas.preload()
