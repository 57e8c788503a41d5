"""The demo nodes of the shipped ``dataflow.yaml``, installed as console scripts so a dataflow names them by
command (``path: primespeech-demo-text-source``) from any folder:

- :mod:`.text_source` (``primespeech-demo-text-source``): sends a script of texts like dora-text-segmenter and
  waits for each answer; the built-in script is ``script.txt`` beside it;
- :mod:`.wav_sink` (``primespeech-demo-wav-sink``): writes one WAV per question and ``report.json``;
- :mod:`.orchestrator` (``primespeech-demo-orchestrator``): an LLM front end's stand-in (streaming, barge-in,
  ``change_voice``).

They use only dora, pyarrow, numpy and soundfile: nothing of the TTS engine.
"""
