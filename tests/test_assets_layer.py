"""``assets`` (voice catalog, downloads) sits below the engine: it imports nothing of the engine, the CoreML
export, the dataflow, the node or the CLI; what those add after a download is passed in by the caller."""

from __future__ import annotations

from tests.test_architecture import import_graph

ABOVE_ASSETS = ("engine", "coreml", "dataflow", "node", "cli", "bench")


def test_assets_import_nothing_above_them():
    graph = import_graph()
    bad = {m: sorted(t for t in targets if t.split(".")[1] in ABOVE_ASSETS)
           for m, targets in graph.items() if m.startswith("dora_primespeech_mlx.assets")}
    assert not any(bad.values()), bad


def test_download_runs_the_callers_step_after_converting(tmp_path, monkeypatch):
    from dora_primespeech_mlx.assets import download
    from tests.test_download import FakeHub

    FakeHub().install(monkeypatch)
    seen = []
    spec = download.download_voice("Doubao", tmp_path, after_convert=lambda s, root: seen.append((s.name, root)))
    assert seen == [(spec.name, tmp_path)] and len(list((tmp_path / "mlx").iterdir())) == 4
    download.download_voice("Doubao", tmp_path, convert=False, after_convert=lambda s, root: seen.append(s))
    assert len(seen) == 1  # nothing converted, nothing to prepare
