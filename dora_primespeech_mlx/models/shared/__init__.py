"""Pieces every network uses: weight helpers (``common``), activations, and float16 weight storage
(``storage``)."""
