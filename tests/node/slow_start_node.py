"""The node form (``dora_primespeech_mlx.node.main``) with a start-up that lasts ``SLOW_START_S`` seconds longer
(default 120): the real engine is built and the start voice loaded, then the build waits before it returns, as the
warm-up of a big voice on a slow machine does. Texts, STOP and signals that come meanwhile meet a node in its
start-up, with a worker that has used MLX. Run as a file (``path:`` of a dataflow node, or ``python`` with the
stand-in for dora): the tests of stopping during the start-up (tests/node/test_sigterm.py, test_dora_stop.py)."""

import os
import sys
import time

from dora_primespeech_mlx import node

SLOW_START_S = float(os.environ.get("SLOW_START_S", "120"))
STILL_STARTING = "the start-up goes on"  # logged once the voice is loaded, while the start-up waits

_real = node.engine_factory


def slow_factory(settings):
    build = _real(settings)

    def slow_build(progress):
        built = build(progress)
        progress(f"{STILL_STARTING} for {SLOW_START_S:.0f} s (a slow warm-up)")
        time.sleep(SLOW_START_S)
        return built

    return slow_build


node.engine_factory = slow_factory

if __name__ == "__main__":
    sys.exit(node.main())
