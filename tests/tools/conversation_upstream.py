"""The original GPT-SoVITS's side of ``primespeech-mlx bench --conversation``: its ``TTS.run`` in
``streaming_mode``, fed each sentence as the LLM stand-in completes it. It runs in the compare tools' venv (the
original's PyTorch; ``../shared/tools/compare``), which lacks this package's dependencies, so it loads the bench's
``conversation.py`` by its path (that file imports only the standard library at its top) and keeps the PyTorch code
out of the package. The orchestrator starts it; see docs/conversation.md."""

from __future__ import annotations

import importlib.util
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

_CONV = Path(__file__).resolve().parents[2] / "dora_primespeech_mlx" / "bench" / "conversation.py"
_spec = importlib.util.spec_from_file_location("primespeech_conversation", _CONV)
conv = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = conv  # (its dataclasses look their module up)
_spec.loader.exec_module(conv)


class UpstreamSide:
    """The original's ``TTS`` (streaming_mode, 16-token chunks as sidebyside.py drives it) on the real-size set,
    with the compare tools' fixed front end (``tools``: the compare tools folder)."""

    def __init__(self, models: str, tools: str, threads: int | None, split: str):
        sys.path.insert(0, tools)
        sys.argv = [sys.argv[0], "--preset", "public", "--out", os.path.join(tempfile.gettempdir(), "unused")]
        import make_fixtures as mf  # the compare tools: puts the original's checkout ($GSV_ROOT) on sys.path
        import torch

        if threads:
            torch.set_num_threads(threads)
        from text.LangSegmenter import LangSegmenter
        from TTS_infer_pack.TTS import TTS, TTS_Config

        cfg = TTS_Config({"custom": {
            "device": "cpu", "is_half": False, "version": "v2",
            "t2s_weights_path": os.path.join(models, "gpt", "s1-v2-random.ckpt"),
            "vits_weights_path": os.path.join(models, "sovits", "s2G-v2-random.pth"),
            "bert_base_path": os.path.join(models, "chinese-roberta-wwm-ext-large"),
            "cnhuhbert_base_path": os.path.join(models, "chinese-hubert-base")}})
        cfg.configs_path = os.path.join(tempfile.gettempdir(), "conversation_tts_infer.yaml")
        ref = os.path.join(models, "ref_5s_32k.wav")
        if not os.path.exists(ref):  # the compare tools' reference clip (sidebyside.py writes the same)
            import numpy as np
            import soundfile as sf

            wave = mf.synth_wave(32000, 5 * 32000, 99, f0=(120.0, 220.0), amp=0.7)
            sf.write(ref, np.round(wave * 32767).astype(np.int16), 32000, subtype="PCM_16")
        self.tts = TTS(cfg)
        self.mf, self.segmenter = mf, LangSegmenter
        self.inputs = {"ref_audio_path": os.path.join(models, "ref_5s_32k.wav"),
                       "prompt_text": "这是一段用于测试的参考音频。", "prompt_lang": "all_zh", "top_k": 15, "top_p": 1,
                       "temperature": 1, "text_split_method": split,
                       "batch_size": 1, "speed_factor": 1.0, "seed": 1, "repetition_penalty": 1.35,
                       "streaming_mode": True, "parallel_infer": False, "fixed_length_chunk": True,
                       "min_chunk_length": 16, "return_fragment": False}
        self.fragments = False

    def run(self, script: conv.Script, lang: str, run_id: int) -> dict:
        self.tts.text_preprocessor.clean_text_inf = self.mf.fixed_frontend_for(lang)
        self.segmenter.getTexts = staticmethod(lambda text, default_lang="": [{"lang": lang, "text": text}])
        texts: queue.Queue = queue.Queue()
        audio: list[tuple[float, float]] = []

        def worker():
            while (text := texts.get()) is not None:
                for sr, chunk in self.tts.run(dict(self.inputs, text=text, text_lang=f"all_{lang}"
                                                   if lang == "zh" else lang)):
                    audio.append((time.perf_counter(), len(chunk) / sr))

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        t0 = time.perf_counter()
        conv.feed(script, lambda text, _meta: texts.put(text), False, t0)
        texts.put(None)
        thread.join()
        out = conv.metrics(script, [(at - t0, d) for at, d in audio])
        out["fed"] = "sentences"
        return out


if __name__ == "__main__":
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    code = conv.side_main(sys.argv[1:], upstream=UpstreamSide)
    sys.stdout.flush()
    os._exit(code)  # not the interpreter's teardown: PyTorch's threads may still be winding down
