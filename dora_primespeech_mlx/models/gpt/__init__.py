"""The GPT (text-to-semantic) network: its math in MLX (``model``), the KV cache (``kv_cache``), sampling and
generation (``generate``), rows decoded together (``batch``), the numpy / C-kernel decode step (``numpy_decoder``)
and the one place that chooses which decode step runs (``decode``)."""
