"""Text front end of GPT-SoVITS v2: text -> chunks -> language segments -> phones and phone ids.

No MLX here: the engine turns :class:`PhoneResult` segments into BERT features and model inputs.
The G2P libraries (Chinese, English; Japanese, Korean, Cantonese from the pip extras ja/ko/yue) are loaded
on first use.
"""

from .errors import TextFrontendError, UnsupportedLanguageError
from .frontend import (
    Chunk,
    PhoneResult,
    Segment,
    clean_text,
    get_phones,
    phones_json,
    preprocess,
    prompt_phones,
    prompt_text_input,
)
from .language_segments import SUPPORTED_OPTIONS, check_option, split_languages
from .options import TextData
from .segmentation import get_method, split_text
from .speakable import has_speakable
from .symbols import cleaned_text_to_sequence, symbol_to_id

__all__ = [
    "SUPPORTED_OPTIONS",
    "Chunk",
    "PhoneResult",
    "Segment",
    "TextData",
    "TextFrontendError",
    "UnsupportedLanguageError",
    "check_option",
    "clean_text",
    "cleaned_text_to_sequence",
    "get_method",
    "get_phones",
    "has_speakable",
    "phones_json",
    "preprocess",
    "prompt_phones",
    "prompt_text_input",
    "split_languages",
    "split_text",
    "symbol_to_id",
]
