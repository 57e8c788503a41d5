"""Wheel check: the package as a user installs it, outside the checkout.

    python tests/wheel_check.py [--keep]

1. ``pip wheel --no-deps <checkout>`` builds the wheel;
2. a fresh venv in a temporary folder (outside the checkout) gets ``pip install <wheel>`` (not editable, with
   its dependencies; ``dora-rs`` pinned to the version of the ``dora`` CLI that runs the flow);
3. from a folder that is not the checkout, with no ``PYTHONPATH``: the package imports from that venv's
   site-packages, its package data (the Zenoh overlay, the preset voices) is there, and
   ``primespeech-mlx say`` speaks the fixture e2e case's text with a voice built from the fixture models into a
   WAV that is checked non-empty;
4. a ``dora run`` of a dataflow whose TTS node is the installed console script ``dora-primespeech-mlx`` (the demo
   text source and WAV sink copied next to it) answers every text with audio and exits 0.

The fixture set is ``PRIMESPEECH_FIXTURES`` (default ``../shared/fixtures`` beside the checkout); the text
front end's offline data ``NLTK_DATA`` / ``PRIMESPEECH_TEXT_DATA`` default to ``../shared`` like the tests'.
Exit status 0 when every step passed; the temporary folder is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
VOICE = "Tiny"
STEP_TIMEOUT_S = 900


def fixtures_root() -> Path:
    return Path(os.environ.get("PRIMESPEECH_FIXTURES", str(SHARED / "fixtures"))).expanduser().resolve()


def e2e_case(root: Path) -> tuple[dict, dict]:
    """(cases.json, its first e2e case) of the fixture set's models/."""
    cases = json.loads((root / "models" / "cases.json").read_text(encoding="utf-8"))
    e2e = [c for c in cases["cases"] if c["name"].startswith("e2e")]
    if not e2e:
        raise SystemExit(f"{root / 'models' / 'cases.json'} has no e2e case")
    return cases, e2e[0]


def write_voice(model_dir: Path, root: Path) -> dict:
    """voices/<VOICE>/voice.yaml made of the fixture checkpoints and the e2e case's reference clip, prompt and
    language (as tests/node/tiny_voice.py builds it); returns the case."""
    cases, case = e2e_case(root)
    inputs, ck = case["inputs"], cases["checkpoints"]
    folder = model_dir / "voices" / VOICE
    folder.mkdir(parents=True)
    data = {
        "name": VOICE, "language": inputs["text_lang"], "prompt_text": inputs["prompt_text"],
        "prompt_lang": inputs["prompt_lang"], "speed_factor": 1.0,
        "gpt": str(root / "models" / ck["gpt"]), "sovits": str(root / "models" / ck["sovits"]),
        "reference": str(root / "models" / inputs["ref_audio_path"]),
        "hubert": str(root / "models" / ck["hubert"]), "bert": str(root / "models" / ck["bert"]),
    }
    for key in ("gpt", "sovits", "reference", "hubert", "bert"):
        if not Path(data[key]).exists():
            raise SystemExit(f"fixture file {data[key]} not found (set PRIMESPEECH_FIXTURES)")
    (folder / "voice.yaml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return case


def run(cmd: list[str], *, cwd: Path, env: dict | None = None, timeout: float = STEP_TIMEOUT_S) -> str:
    """Run a step in its own process group; its output on failure (and the whole group killed on a timeout)."""
    print("$", " ".join(str(c) for c in cmd), flush=True)
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise SystemExit(f"timed out after {timeout:.0f} s: {cmd}\n{out[-4000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"failed (exit {proc.returncode}): {cmd}\n{out[-6000:]}")
    return out


def dora_cli() -> str:
    exe = Path(sys.executable).parent / "dora"
    found = str(exe) if exe.exists() else shutil.which("dora")
    if not found:
        raise SystemExit("the dora CLI (dora-rs-cli) is not installed in this environment")
    return found


def user_env(venv: Path) -> dict:
    """The environment of a user of the installed wheel: its venv first on PATH, no PYTHONPATH, offline text
    data from ../shared where the tests find it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env.setdefault("PRIMESPEECH_AUTO_DOWNLOAD", "false")
    if "NLTK_DATA" not in env and (SHARED / "nltk_data").is_dir():
        env["NLTK_DATA"] = str(SHARED / "nltk_data")
    if "PRIMESPEECH_TEXT_DATA" not in env and (SHARED / "data" / "gpt-sovits-text").is_dir():
        env["PRIMESPEECH_TEXT_DATA"] = str(SHARED / "data" / "gpt-sovits-text")
    return env


FLOW = """\
nodes:
  - id: text_source
    path: {work}/text_source.py
    inputs:
      segment_complete: {{source: primespeech/segment_complete, queue_size: 1000}}
      status: {{source: primespeech/status, queue_size: 1000}}
    outputs: [text, control, done]
    env:
      SCRIPT_FILE: {work}/script.txt

  - id: primespeech
    path: dora-primespeech-mlx
    inputs:
      text: {{source: text_source/text, queue_size: 1000}}
      control: {{source: text_source/control, queue_size: 1000}}
    outputs: [audio, segment_complete, status, log]
    env:
      VOICE_NAME: {voice}
      PRIMESPEECH_MODEL_DIR: {model_dir}
      GPTSVITS_WARMUP: "false"
      TOP_K: 1

  - id: wav_sink
    path: {work}/wav_sink.py
    inputs:
      audio: {{source: primespeech/audio, queue_size: 1000}}
      segment_complete: {{source: primespeech/segment_complete, queue_size: 1000}}
      status: {{source: primespeech/status, queue_size: 1000}}
      text: {{source: text_source/text, queue_size: 1000}}
      done: {{source: text_source/done, queue_size: 1000}}
    env:
      OUTPUT_DIR: {work}/out
"""


def check(tmp: Path) -> None:
    root = fixtures_root()
    dist, venv, work = tmp / "dist", tmp / "venv", tmp / "work"
    work.mkdir()
    t0 = time.monotonic()

    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(dist)], cwd=tmp)
    (wheel,) = dist.glob("dora_primespeech_mlx-*.whl")
    print(f"built {wheel.name} ({wheel.stat().st_size / 1e3:.0f} kB) in {time.monotonic() - t0:.0f} s", flush=True)

    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    py = venv / "bin" / "python"
    pin = f"dora-rs=={metadata.version('dora-rs')}"  # the node API of the dora CLI that runs the flow
    run([py, "-m", "pip", "install", "-q", str(wheel), pin], cwd=tmp)
    print(f"installed into {venv} ({time.monotonic() - t0:.0f} s so far)", flush=True)

    env = user_env(venv)
    probe = ("import json, dora_primespeech_mlx as p, dora_primespeech_mlx.engine as e; "
             "from dora_primespeech_mlx.settings import ZENOH_OVERLAY as z; "
             "from dora_primespeech_mlx.assets import catalog as c; from pathlib import Path; "
             "print(json.dumps({'file': p.__file__, 'engine': e.__file__, 'overlay': str(z), "
             "'overlay_exists': Path(z).is_file(), 'presets': c.preset_names()}))")
    info = json.loads(run([py, "-c", probe], cwd=work, env=env).strip().splitlines()[-1])
    site = str(venv.resolve())
    if not (info["file"].startswith(site) and info["engine"].startswith(site)):
        raise SystemExit(f"the package did not import from the wheel's venv: {info}")
    if str(REPO) in info["file"]:
        raise SystemExit(f"the package imported from the checkout: {info}")
    if not info["overlay_exists"] or not info["presets"]:
        raise SystemExit(f"package data missing from the wheel: {info}")
    print(f"imports from {Path(info['file']).parent}; presets {info['presets']}", flush=True)

    model_dir = tmp / "models"
    case = write_voice(model_dir, root)
    env["PRIMESPEECH_MODEL_DIR"] = str(model_dir)
    wav = work / "say.wav"
    text, lang = case["inputs"]["text"], case["inputs"]["text_lang"]
    run([venv / "bin" / "primespeech-mlx", "say", text, "--voice", VOICE, "--lang", lang, "-o", wav], cwd=work,
        env=env)
    import soundfile as sf

    data, sr = sf.read(str(wav), dtype="float32")
    if data.size == 0 or not (abs(data).max() > 0):
        raise SystemExit(f"{wav}: no audio ({data.size} samples)")
    print(f"say: {data.size / sr:.2f} s of audio at {sr} Hz ({time.monotonic() - t0:.0f} s so far)", flush=True)

    for name in ("text_source.py", "wav_sink.py"):
        shutil.copy(REPO / "nodes" / name, work / name)
    (work / "script.txt").write_text(f"{text}\n\n{text}\n", encoding="utf-8")
    flow = work / "dataflow.yaml"
    flow.write_text(FLOW.format(work=work, voice=VOICE, model_dir=model_dir), encoding="utf-8")
    env["DORA_ZENOH_CONFIG_OVERLAY"] = info["overlay"]
    script = shutil.which("dora-primespeech-mlx", path=env["PATH"])
    if script is None or not Path(script).resolve().is_relative_to(venv.resolve()):
        raise SystemExit(f"dora-primespeech-mlx on the flow's PATH is {script}, not the wheel venv's")
    out = run([dora_cli(), "run", flow], cwd=work, env=env)
    spawned = re.findall(r"spawning `([^`]*dora-primespeech-mlx)`", out)
    if spawned and not all(Path(p).resolve().is_relative_to(venv.resolve()) for p in spawned):
        raise SystemExit(f"dora spawned {spawned}, not the wheel venv's console script")
    report_path = work / "out" / "report.json"
    if not report_path.exists():
        raise SystemExit(f"dora run wrote no report\n{out[-4000:]}")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    outcomes = [s["outcome"] for s in report["segments"] if s.get("text")]
    questions = report["questions"]
    if outcomes != ["completed", "completed"] or len(questions) != 2:
        raise SystemExit(f"dora run: answers {outcomes}, questions {sorted(questions)}\n{out[-4000:]}")
    for qid, q in questions.items():
        if not q.get("duration"):
            raise SystemExit(f"dora run: question {qid} got no audio: {q}")
    print(f"dora run: {len(questions)} questions answered with audio ({time.monotonic() - t0:.0f} s in all)",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (printed)")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="primespeech-wheel-")).resolve()
    if REPO in tmp.parents:
        raise SystemExit(f"the temporary folder {tmp} is inside the checkout")
    try:
        check(tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("wheel check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
