"""Runs the packaged demo node ``dora_primespeech_mlx.demo.text_source`` (console script
``primespeech-demo-text-source``) from a path, for dataflows that name nodes by file."""

import sys

from dora_primespeech_mlx.demo.text_source import main

if __name__ == "__main__":
    sys.exit(main())
