"""``bench --compare``: ratios from the runners' SBS lines, and a clear stop when a side is not set up."""

from __future__ import annotations

import argparse

import pytest

from dora_primespeech_mlx.bench import compare as bc


def _args(tmp_path, **kw):
    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true")
    bc.add_arguments(p)
    a = p.parse_args([])
    a.compare = str(tmp_path / "no-such-python")
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _sbs(side, e2e, ttfa=None, timings=None, tokens=100):
    r = {"side": side, "e2e_cached_s": e2e, "e2e_cached_s_median": sorted(e2e)[len(e2e) // 2], "tokens": tokens}
    if ttfa:
        r["ttfa_s"], r["ttfa_s_median"] = ttfa, sorted(ttfa)[len(ttfa) // 2]
    if timings:
        r["timings"] = timings
    r["loadavg_before"] = 1.0
    return r


def test_summary_ratios_and_stages():
    results = {1: {
        "upstream": [_sbs("upstream", [4.0, 4.2, 4.4], [1.0, 1.2, 1.1]), _sbs("upstream", [4.4], [1.2])],
        "ours": [_sbs("ours", [2.0, 2.2, 2.1], [0.5, 0.4, 0.6], {"sovits": 0.8, "gpt_prefill": 0.3, "gpt_decode": 0.9}),
                 _sbs("ours", [2.2], [0.5], {"sovits": 1.0, "gpt_prefill": 0.3, "gpt_decode": 1.1})],
        "genie": [_sbs("genie", [2.4, 2.6, 2.5], [2.5], {"t2s": 1.0, "vits_and_rest": 1.2}),
                  {"error": "exit 1: boom", "loadavg_before": 2.0}],
    }}
    s = bc.summarize(results)[1]
    assert s["ours"]["e2e"] == pytest.approx(2.15)  # median of the 4 timed runs of both rounds
    assert s["upstream"]["e2e_ratio"] == pytest.approx(2.15 / 4.3)
    assert s["upstream"]["ttfa_ratio"] == pytest.approx(0.5 / 1.15)
    assert s["upstream"]["e2e_ratio_rounds"] == pytest.approx([2.1 / 4.2, 2.2 / 4.4])
    assert s["genie"]["e2e_ratio"] == pytest.approx(2.15 / 2.5)
    assert s["genie"]["errors"] == ["exit 1: boom"] and s["genie"]["rounds"] == 1
    assert s["ours"]["sovits_s"] == pytest.approx(0.9)
    assert s["ours"]["gpt_ms_per_token"] == pytest.approx(13.0)
    assert s["genie"]["gpt_ms_per_token"] == pytest.approx(10.0)
    text = bc.table(bc.summarize(results), {"cpufast": "not set up: no interpreter x"})
    assert "0.50x" in text and "cpufast: not set up" in text and "boom" in text


def test_missing_sides_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "sidebyside.py").write_text("")
    cmds = bc.side_commands(_args(tmp_path), tools)
    assert isinstance(cmds["ours"], list) and cmds["ours"][-2:] == ["--split", "cut0"]
    for side in ("upstream", "genie", "cpufast"):
        assert isinstance(cmds[side], str) and cmds[side].startswith("not set up"), cmds[side]


def test_stops_clearly_without_the_set(tmp_path, monkeypatch, capsys):
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "sidebyside.py").write_text("")
    monkeypatch.setenv("REF_BIG", str(tmp_path / "no-set"))
    assert bc.run_compare(_args(tmp_path, compare_tools=str(tools))) == 2
    assert "real-size set is missing" in capsys.readouterr().err
    (tmp_path / "set" / "gpt").mkdir(parents=True)
    (tmp_path / "set" / "gpt" / "s1-v2-random.ckpt").write_bytes(b"")
    monkeypatch.setenv("REF_BIG", str(tmp_path / "set"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert bc.run_compare(_args(tmp_path, compare_tools=str(tools))) == 2
    err = capsys.readouterr().err
    assert "nothing to compare against" in err and "upstream not set up" in err


def test_package_root_is_the_folder_that_holds_the_package():
    """The original's side gets PACKAGE_ROOT on its PYTHONPATH: it must hold ``dora_primespeech_mlx`` (the package
    folder itself would put this package's ``text`` in place of the original's)."""
    assert (bc.PACKAGE_ROOT / "dora_primespeech_mlx" / "__init__.py").is_file()


def test_ours_with_a_forced_build_is_a_side(tmp_path, monkeypatch, capsys):
    """``ours:ISA`` runs this package again with PRIMESPEECH_ISA=ISA (e.g. the AVX2 kernels on an AVX-512 machine),
    gets ratios like any side and reports the build each ours side took; unknown builds are refused."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "sidebyside.py").write_text("")
    cmds = bc.side_commands(_args(tmp_path, sides="ours,ours:avx2"), tools)
    assert cmds["ours:avx2"] == cmds["ours"]
    for bad in ("ours:sse", "upstream:avx2", "ours:"):
        with pytest.raises(SystemExit, match="unknown side"):
            bc.side_commands(_args(tmp_path, sides=bad), tools)
    (tmp_path / "set" / "gpt").mkdir(parents=True)
    (tmp_path / "set" / "gpt" / "s1-v2-random.ckpt").write_bytes(b"")
    monkeypatch.setenv("REF_BIG", str(tmp_path / "set"))
    monkeypatch.delenv("PRIMESPEECH_ISA", raising=False)
    seen = []

    def fake_run_side(argv, threads, env, timeout):
        seen.append(env.get("PRIMESPEECH_ISA"))
        return _sbs("ours", [2.0] if env.get("PRIMESPEECH_ISA") else [1.0])

    monkeypatch.setattr(bc, "run_side", fake_run_side)
    monkeypatch.setattr(bc, "kernel_build", lambda py, env: f"build {env.get('PRIMESPEECH_ISA') or 'auto'}")
    assert bc.run_compare(_args(tmp_path, compare_tools=str(tools), sides="ours,ours:avx2", threads="1")) == 0
    assert seen == [None, "avx2"]
    out = capsys.readouterr().out
    assert "ours:avx2 kernels: build avx2" in out and "ours kernels: build auto" in out and "CPU: " in out
    assert "0.50x" in out  # ours (1.0 s) / ours:avx2 (2.0 s)


def test_ours_with_settings_is_a_side(tmp_path, monkeypatch):
    """``ours:SETTING=VALUE[+SETTING=VALUE]`` runs this package again with those settings (their primary environment
    names), e.g. another vocoder cut; unknown settings and values the setting refuses are refused up front."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "sidebyside.py").write_text("")
    sides = "ours,ours:vocoder_parts=4,ours:vocoder_parts=2+overlap=0"
    cmds = bc.side_commands(_args(tmp_path, sides=sides), tools)
    assert cmds["ours:vocoder_parts=4"] == cmds["ours"] == cmds["ours:vocoder_parts=2+overlap=0"]
    assert bc.side_env({"A": "1"}, "ours:vocoder_parts=4") == {"A": "1", "PRIMESPEECH_VOCODER_PARTS": "4"}
    assert bc.side_env({}, "ours:vocoder_parts=2+overlap=0") == {"PRIMESPEECH_VOCODER_PARTS": "2",
                                                                 "PRIMESPEECH_OVERLAP": "0"}
    assert bc.side_env({"A": "1"}, "ours") == {"A": "1"}
    for bad in ("ours:vocoder_parts=5", "ours:no_such=1", "ours:vocoder_parts", "ours:vocoder_parts=4+",
                "genie:vocoder_parts=4"):
        with pytest.raises(SystemExit, match="unknown side"):
            bc.side_commands(_args(tmp_path, sides=bad), tools)
