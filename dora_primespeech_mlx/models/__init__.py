"""The MLX models (GPT, SoVITS, CNHubert, RoBERTa) and their layers. Importing this package first sets up the
CPU BLAS that MLX links (see ``_blas``): it must happen before ``mlx`` loads."""

from .. import _blas

_blas.preload()
