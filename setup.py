"""Package discovery for setuptools (everything else is in pyproject.toml).

Every package under ``dora_primespeech_mlx/`` is found, not listed, so a new subpackage cannot be left out of
the wheel. The preset voice catalog lives in the top-level ``voices/`` folder of the checkout; the wheel
carries it as ``dora_primespeech_mlx/assets/presets`` (``assets.catalog`` looks in both places).
"""

from setuptools import find_packages, setup

PRESETS = "dora_primespeech_mlx.assets.presets"

setup(
    packages=[*find_packages(include=["dora_primespeech_mlx", "dora_primespeech_mlx.*"]), PRESETS],
    package_dir={PRESETS: "voices"},
)
