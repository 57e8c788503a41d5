"""``bench --memory-levers`` formats one row per fresh engine process and names the RoBERTa storage those
engines chose (not the raw setting, whose default ``auto`` means float16 on a CPU with the kernels)."""

from __future__ import annotations

from dora_primespeech_mlx.bench import memory as bench


def _probe(rss: float, dtype: str) -> dict:
    part = {"rss_mb": rss, "mlx_active_mb": rss / 2, "other_mb": rss / 4}
    return {"loaded": part, "after_requests": part, "after_trim": part, "trim_ms": 1.0, "peak_rss_mb": rss + 2,
            "loading_peak_rss_mb": rss + 1, "bert_dtype": dtype}


def test_memory_levers_rows_and_the_storage_the_engines_used(monkeypatch, tmp_path):
    calls = []

    def fake_engine(root, *levers):
        calls.append(levers)
        return _probe(1000.0 + 10 * len(calls), "float16")

    monkeypatch.setattr(bench, "memory_engine", fake_engine)
    table = bench.memory_levers(tmp_path).splitlines()
    assert "RoBERTa float16" in table[0]
    assert len(calls) == len(bench.MEMORY_LEVERS) + 1 and calls[-1] == calls[0]  # "before" again at the end
    rows = [r for r in table if r.startswith("| ") and not r.startswith("| levers")]
    assert [r.split(" | ")[0][2:] for r in rows] == [m[0] for m in (*bench.MEMORY_LEVERS, bench.MEMORY_LEVERS[0])]
    assert rows[0].split(" | ")[1] == "1010"
    head = table[1].split(" | ")
    assert rows[0].split(" | ")[head.index("peak while loading")] == "1011"  # apart from the process's peak
    assert rows[0].split(" | ")[head.index("peak")] == "1012"


def test_memory_levers_names_mixed_storage(monkeypatch, tmp_path):
    dtypes = iter(["float32", "float16"] * 10)
    monkeypatch.setattr(bench, "memory_engine", lambda root, *levers: _probe(900.0, next(dtypes)))
    assert "RoBERTa float16/float32" in bench.memory_levers(tmp_path).splitlines()[0]
