"""The old dora-primespeech node's per-request defaults (its wrapper's optimization_config), in one place:
the engine's ``SynthesisConfig`` and the node's ``Settings`` both take them from here."""

TOP_K = 5
TOP_P = 1.0
TEMPERATURE = 1.0
REPETITION_PENALTY = 1.35
FRAGMENT_INTERVAL = 0.3
TEXT_SPLIT_METHOD = "cut5"
SEED = 233333
NOISE_SCALE = 0.5
