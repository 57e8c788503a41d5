"""Symbol tables (v1: 322, v2: 732) against upstream's, exported in text/symbols_v*.json."""

from __future__ import annotations

import json

import pytest
from conftest import require_fixture

from dora_primespeech_mlx.text import symbols as S
from dora_primespeech_mlx.text.errors import TextFrontendError


def _table(version: str) -> dict:
    with open(require_fixture(f"text/symbols_{version}.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_table_equals_upstream(version):
    ref = _table(version)
    assert list(S.symbols(version)) == ref["symbols"]
    assert len(S.symbols(version)) == ref["count"]
    assert S.symbol_to_id(version) == ref["id_of"]
    assert S.symbol_to_id(version)[ref["pad"]] == ref["pad_id"]
    for name, idx in ref["special"].items():
        assert S.symbol_to_id(version)[name] == idx
    assert ref["punctuation"] == S.PUNCTUATION


def test_v1_is_prefix_of_v2():
    assert S.symbols("v2")[: len(S.symbols("v1"))] == S.symbols("v1")


@pytest.mark.parametrize("version", ["v2Pro", "v2ProPlus", "v3", "v4"])
def test_later_versions_use_v2_table(version):
    assert S.symbols(version) == S.symbols("v2")


def test_cleaned_text_to_sequence():
    ref = _table("v2")
    phones = ["n", "i2", "h", "ao3", "SP2", "UNK", "…", "Yz", "ㄱ"]
    assert S.cleaned_text_to_sequence(phones, "v2") == [ref["id_of"][p] for p in phones]
    assert S.cleaned_text_to_sequence(["!", "AA"], "v1") == [0, 5]
    with pytest.raises(TextFrontendError, match="Yz"):
        S.cleaned_text_to_sequence(["Yz"], "v1")
