"""Chinese text normalisation: numbers, dates, times, units and symbols written out in characters.

A re-implementation of the normaliser the original GPT-SoVITS front end uses
(``text/zh_normalization``, itself from PaddleSpeech); ``normalize(text)`` returns its sentences.
"""

from .normalizer import TextNormalizer, normalize
from .numbers import num2str, verbalize_cardinal, verbalize_digit
from .traditional import to_simplified

__all__ = ["TextNormalizer", "normalize", "num2str", "to_simplified", "verbalize_cardinal", "verbalize_digit"]
