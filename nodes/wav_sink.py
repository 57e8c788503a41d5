"""Runs the packaged demo node ``dora_primespeech_mlx.demo.wav_sink`` (console script
``primespeech-demo-wav-sink``) from a path, for dataflows that name nodes by file."""

import sys

from dora_primespeech_mlx.demo.wav_sink import main

if __name__ == "__main__":
    sys.exit(main())
