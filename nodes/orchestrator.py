"""Runs the packaged demo node ``dora_primespeech_mlx.demo.orchestrator`` (console script
``primespeech-demo-orchestrator``) from a path, for dataflows that name nodes by file."""

import sys

from dora_primespeech_mlx.demo.orchestrator import main

if __name__ == "__main__":
    sys.exit(main())
