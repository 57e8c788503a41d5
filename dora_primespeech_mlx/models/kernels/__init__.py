"""The float16-weight C kernels' Python side: which build runs (``half_gemv``), a weight wrapped for them
(``half_matrix``), and which product path each CPU stage takes (``cpu_paths``)."""
