"""A user voice built from the fixture models (tiny random-weight GPT-SoVITS v2), for the node tests.

The voice YAML goes into ``<tmp model dir>/voices/<name>/voice.yaml`` and points to the fixture files
named in ``models/cases.json`` (``checkpoints``) and to the reference clip, prompt and language of its
``e2e`` case (English with zero BERT features when the set's tiny BERT cannot feed the GPT, Chinese when it is
1024 wide: the fixture README says which).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from conftest import fixtures_root, load_cases_json, model_cases, require_fixture

VOICE = "Tiny"
VOICE_2 = "Tiny Two"  # same models, another name: change_voice between two installed voices


def e2e_case() -> dict:
    cases = model_cases("e2e")
    if not cases:
        require_fixture("models/cases.json")
        raise AssertionError("models/cases.json has no e2e case")
    return cases[0]


def reference_wav() -> Path:
    return require_fixture(Path("models") / e2e_case()["inputs"]["ref_audio_path"])


def checkpoint(kind: str) -> Path:
    require_fixture("models/cases.json")
    return require_fixture(Path("models") / load_cases_json()["checkpoints"][kind])


def write_voice(model_dir: Path, name: str = VOICE, speed_factor: float = 1.0, language: str | None = None) -> Path:
    """A voice of the fixture models; ``language``: its text language (default: the e2e case's)."""
    inputs = e2e_case()["inputs"]
    folder = model_dir / "voices" / name
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "name": name,
        "language": language or inputs["text_lang"],
        "prompt_text": inputs["prompt_text"],
        "prompt_lang": inputs["prompt_lang"],
        "speed_factor": speed_factor,
        "gpt": str(checkpoint("gpt")),
        "sovits": str(checkpoint("sovits")),
        "reference": str(reference_wav()),
        "hubert": str(checkpoint("hubert")),
        "bert": str(checkpoint("bert")),
    }
    path = folder / "voice.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def make_model_dir(root: Path) -> Path:
    """A model directory with the two tiny voices and the text front end's dictionaries (``text-data``)."""
    root.mkdir(parents=True, exist_ok=True)
    write_voice(root, VOICE)
    write_voice(root, VOICE_2, speed_factor=1.25)
    link_text_data(root)
    return root


def link_text_data(root: Path) -> None:
    """``<root>/text-data``, where an installed model directory keeps the original front end's dictionaries: a
    link to the copy the tests use (``PRIMESPEECH_TEXT_DATA``, set by tests/conftest.py), so that settings built
    from a test's own variables (no ``PRIMESPEECH_TEXT_DATA`` among them) find them offline."""
    shared = os.environ.get("PRIMESPEECH_TEXT_DATA")
    target = root / "text-data"
    if shared and not target.exists():
        target.symlink_to(Path(shared).resolve(), target_is_directory=True)


__all__ = ["VOICE", "VOICE_2", "checkpoint", "e2e_case", "fixtures_root", "make_model_dir", "reference_wav",
           "write_voice"]
