"""The old dora-primespeech node's per-request defaults (its wrapper's optimization_config) and the valid
range of every request parameter, in one place: the engine's ``SynthesisConfig`` validates requests with
:data:`RANGES` and the node's ``Settings`` checks the environment with the same table, so a value the
settings accept is never refused later by the engine."""

from dataclasses import dataclass

TOP_K = 5
TOP_P = 1.0
TEMPERATURE = 1.0
REPETITION_PENALTY = 1.35
FRAGMENT_INTERVAL = 0.3
TEXT_SPLIT_METHOD = "cut5"
SEED = 233333
NOISE_SCALE = 0.5

TEXT_SPLIT_METHODS = ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5")


@dataclass(frozen=True)
class RequestDefaults:
    """The request parameters both the engine's ``SynthesisConfig`` and the node's ``Settings`` carry, with the
    old node's values (``speed_factor`` None: the voice's own)."""

    top_k: int = TOP_K
    top_p: float = TOP_P
    temperature: float = TEMPERATURE
    repetition_penalty: float = REPETITION_PENALTY
    speed_factor: float | None = None
    fragment_interval: float = FRAGMENT_INTERVAL
    seed: int = SEED
    text_split_method: str = TEXT_SPLIT_METHOD
    noise_scale: float = NOISE_SCALE
MAX_TOKENS = 1500  # the GPT's step cap (upstream max_steps)


class Range:
    """A closed or half-open numeric interval ``lo <= x <= hi`` (``lo < x`` when ``lo_open``)."""

    def __init__(self, lo: float, hi: float, lo_open: bool = False, integer: bool = False, unit: str = ""):
        self.lo, self.hi, self.lo_open, self.integer, self.unit = lo, hi, lo_open, integer, unit

    def contains(self, x: float) -> bool:
        return (self.lo < x if self.lo_open else self.lo <= x) and x <= self.hi

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        lo = f"({self.lo:g}" if self.lo_open else f"{self.lo:g}"
        span = f"in {lo}, {self.hi:g}]" if self.lo_open else f"in {self.lo:g}..{self.hi:g}"
        return f"must be {kind}{' of ' + self.unit if self.unit else ''} {span}"


# request parameter -> its valid range (SynthesisConfig field names)
RANGES: dict[str, Range] = {
    "top_k": Range(1, 1024, integer=True),
    "top_p": Range(0, 1, lo_open=True),
    "temperature": Range(0, 10, lo_open=True),
    "repetition_penalty": Range(0, 10, lo_open=True),
    "speed_factor": Range(0.25, 4),
    "fragment_interval": Range(0, 10, unit="seconds"),
    "seed": Range(-1, 2**32 - 1, integer=True),
    "noise_scale": Range(0, 10),
    "stream_first_tokens": Range(1, MAX_TOKENS, integer=True),
    "stream_chunk_tokens": Range(1, MAX_TOKENS, integer=True),
    "stream_context_tokens": Range(0, MAX_TOKENS, integer=True),
    "stream_lookahead_tokens": Range(0, MAX_TOKENS, integer=True),
    "stream_crossfade_ms": Range(0, 40, unit="milliseconds"),
    "stream_ramp": Range(1, 4),
    "stream_vocoder_margin": Range(0, 4096, integer=True, unit="frames"),
}
