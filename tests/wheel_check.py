"""Wheel check: the package as a user installs it, outside the checkout.

    python tests/wheel_check.py [--keep]

1. ``pip wheel --no-deps <checkout>`` builds the wheel, which must hold the LICENSE and the demo script;
2. a fresh venv in a temporary folder (outside the checkout) gets what the README's run command installs:
   ``pip install "<wheel>[dora]"`` (not editable, with its dependencies and the ``dora`` CLI; ``dora-rs`` and
   ``dora-rs-cli`` pinned to this environment's versions where it has them, so nothing new is fetched);
3. from a folder that is not the checkout, with no ``PYTHONPATH``: the package imports from that venv's
   site-packages, its package data (the Zenoh overlay, the preset voices) is there, and
   ``primespeech-mlx say`` speaks the fixture e2e case's text with a voice built from the fixture models into a
   WAV that is checked non-empty;
4. the shipped ``dataflow.yaml``, written into that folder by ``primespeech-mlx dataflow``, runs with the venv's
   ``dora run`` as the README says, the voice, model folder and texts given by the shell (``VOICE_NAME``,
   ``PRIMESPEECH_MODEL_DIR``, ``SCRIPT_FILE``): every node is the venv's console script, every text is answered,
   and ``out/`` holds one non-silent WAV per question.

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
import zipfile
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


def dora_pins() -> list[str]:
    """``dora-rs`` / ``dora-rs-cli`` at this environment's versions (one dora version for the node API and the
    CLI, and no download where pip's cache has them); none for a package this environment lacks."""
    pins = []
    for dist in ("dora-rs", "dora-rs-cli"):
        try:
            pins.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def check_wheel_files(wheel: Path) -> None:
    """The wheel carries the license, the demo nodes' script, the demo dataflow and the node manifest (package
    data)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    for wanted in ("/LICENSE", "dora_primespeech_mlx/demo/script.txt", "dora_primespeech_mlx/demo/dataflow.yaml",
                   "dora_primespeech_mlx/dora-node.yml"):
        if not any(n.endswith(wanted) for n in names):
            raise SystemExit(f"{wheel.name} has no {wanted.lstrip('/')}")
    with zipfile.ZipFile(wheel) as z:  # what `pip show -v` prints: the license and the project's links
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode("utf-8")
    for wanted in ("License-Expression: MIT", "Project-URL: ", "Classifier: "):
        if wanted not in meta:
            raise SystemExit(f"{wheel.name}'s METADATA has no {wanted.strip()}")


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


def check(tmp: Path) -> None:
    root = fixtures_root()
    dist, venv, work = tmp / "dist", tmp / "venv", tmp / "work"
    work.mkdir()
    t0 = time.monotonic()

    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(dist)], cwd=tmp)
    (wheel,) = dist.glob("dora_primespeech_mlx-*.whl")
    check_wheel_files(wheel)
    print(f"built {wheel.name} ({wheel.stat().st_size / 1e3:.0f} kB) in {time.monotonic() - t0:.0f} s", flush=True)

    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    py = venv / "bin" / "python"
    run([py, "-m", "pip", "install", "-q", f"{wheel}[dora]", *dora_pins()], cwd=tmp)
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

    run_shipped_dataflow(venv, work, env, model_dir, text)
    print(f"wheel check done in {time.monotonic() - t0:.0f} s", flush=True)


def run_shipped_dataflow(venv: Path, work: Path, env: dict, model_dir: Path, text: str) -> None:
    """Step 4: the shipped dataflow.yaml, unchanged, from ``work`` (outside the checkout)."""
    import soundfile as sf

    t0 = time.monotonic()
    run([venv / "bin" / "primespeech-mlx", "dataflow"], cwd=work, env=env)  # the packaged copy of dataflow.yaml
    if (work / "dataflow.yaml").read_bytes() != (REPO / "dataflow.yaml").read_bytes():
        raise SystemExit("`primespeech-mlx dataflow` wrote another file than the checkout's dataflow.yaml")
    (work / "script.txt").write_text(f"{text}\n\n{text}\n", encoding="utf-8")  # two questions, one text each
    env = {**env, "VOICE_NAME": VOICE, "PRIMESPEECH_MODEL_DIR": str(model_dir), "SCRIPT_FILE": str(work / "script.txt"),
           "GPTSVITS_WARMUP": "false", "TOP_K": "1", "RUST_BACKTRACE": "0"}
    flow = yaml.safe_load((work / "dataflow.yaml").read_text(encoding="utf-8"))
    for node in flow["nodes"]:
        script = shutil.which(node["path"], path=env["PATH"])
        if script is None or not Path(script).resolve().is_relative_to(venv.resolve()):
            raise SystemExit(f"node {node['id']}: {node['path']} on the flow's PATH is {script}, not the wheel venv's")
    out = run([venv / "bin" / "dora", "run", "dataflow.yaml"], cwd=work, env=env)
    spawned = re.findall(r"spawning `([^`]+)`", out)
    outside = [p for p in spawned if not Path(p).resolve().is_relative_to(venv.resolve())]
    if not spawned or outside:
        raise SystemExit(f"dora spawned {outside or 'nothing'} outside the wheel venv\n{out[-4000:]}")
    report_path = work / "out" / "report.json"
    if not report_path.exists():
        raise SystemExit(f"dora run wrote no report\n{out[-4000:]}")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    outcomes = [s["outcome"] for s in report["segments"] if s.get("text")]
    if outcomes != ["completed", "completed"]:
        raise SystemExit(f"dora run: answers {outcomes}\n{out[-4000:]}")
    wavs = sorted((work / "out").glob("*.wav"))
    if [w.name for w in wavs] != ["question_1.wav", "question_2.wav"]:
        raise SystemExit(f"dora run: out/ holds {[w.name for w in wavs]}, not one WAV per question")
    for wav in wavs:
        data, sr = sf.read(str(wav), dtype="float32")
        rms = float((data.astype("float64") ** 2).mean() ** 0.5) if data.size else 0.0
        if data.size < sr // 10 or rms < 1e-4:
            raise SystemExit(f"dora run: {wav.name} is silent or empty ({data.size} samples, RMS {rms:.2e})")
    print(f"dora run dataflow.yaml: {len(wavs)} WAVs in out/ ({time.monotonic() - t0:.0f} s)", flush=True)


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
