"""ERes2NetV2, the v2Pro speaker-verification embedding (``model``) and its Kaldi fbank front end (``fbank``)."""
