"""English front end: parity with the original GPT-SoVITS v2 on every English segment of the fixtures,
focused checks of documented normalisations, and the data layer (checksums, downloads, NLTK data).

Upstream's ``cleaner.clean_text`` returns, for an English segment, ``english.g2p(norm_text)`` with a
``","`` put in front when that list has fewer than 4 phones. ``english.g2p`` does not add the comma
(the pipeline does), so the fixture phones are compared with ``[","] + g2p(...)`` in that case.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import urllib.error
from pathlib import Path

import nltk
import pytest
from conftest import case_rows, fixtures_required, load_text_data, param_or_missing, require_fixture

from dora_primespeech_mlx.text import data
from dora_primespeech_mlx.text.en_normalization import normalize
from dora_primespeech_mlx.text.errors import TextFrontendError
from dora_primespeech_mlx.text.options import TextData

DATA = load_text_data()  # the text front end's folders (tests/conftest.py)

CASES = "text/cases_v2.jsonl"
SYMBOLS = "text/symbols_v2.json"

# The shared data folder as conftest set it up, captured before any test changes the environment.
_TEXT_DATA = os.environ.get("PRIMESPEECH_TEXT_DATA", "")


def _english_segments() -> list[dict]:
    return [
        dict(seg, case_id=case["id"], index=i)
        for case in case_rows(CASES)
        for i, seg in enumerate(case.get("segments") or [])
        if seg["lang"] == "en"
    ]


def _skip_or_fail(msg: str):
    if fixtures_required():
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def english():
    """The English module with its data available offline (skip, or fail in CI, when it is not)."""
    folder = Path(_TEXT_DATA) if _TEXT_DATA else None
    if folder is None or not all(
        (folder / name).is_file() for name in data.DATA_FILES if name.endswith((".rep", ".json"))
    ):
        _skip_or_fail("English dictionaries not found: set PRIMESPEECH_TEXT_DATA (see tests/conftest.py)")
    try:
        data.ensure_nltk_data(data=DATA)
    except TextFrontendError as err:
        _skip_or_fail(f"NLTK data not available offline: {err}")
    from dora_primespeech_mlx.text import english

    return english


def _with_comma_rule(phones: list[str]) -> list[str]:
    return [","] + phones if len(phones) < 4 else phones


# --------------------------------------------------------------------------------- fixture parity


@pytest.mark.parametrize("seg", param_or_missing(_english_segments(), lambda s: f"{s['case_id']}-{s['index']}", CASES))
def test_segment_matches_upstream(seg, english):
    if seg is None:
        require_fixture(CASES)
        pytest.skip(f"{CASES} has no English segments")
    norm_text = english.text_normalize(seg["text"])
    assert norm_text == seg["norm_text"]
    phones = _with_comma_rule(english.g2p(norm_text, data=DATA))
    assert phones == seg["phones"]


def test_phone_ids_use_the_v2_table(english):
    """Every English phone maps to the fixture ids (so the v2 table really holds what g2p returns)."""
    table = json.loads(require_fixture(SYMBOLS).read_text(encoding="utf-8"))["id_of"]
    segments = _english_segments()
    if not segments:
        pytest.skip(f"{CASES} has no English segments")
    for seg in segments:
        phones = _with_comma_rule(english.g2p(english.text_normalize(seg["text"]), data=DATA))
        assert [table[p] for p in phones] == seg["phone_ids"], seg["text"]


def test_kept_symbols_are_the_v2_symbols_the_dictionaries_use(english):
    """g2p keeps a fixed English subset of the v2 table; it must lose nothing upstream would keep."""
    v2 = set(json.loads(require_fixture(SYMBOLS).read_text(encoding="utf-8"))["symbols"])
    kept = english._V2_ENGLISH
    assert kept <= v2
    used = {ph for phones in english.english_dictionary(data=DATA).values() for ph in phones}
    used |= {ph for phones in english.name_dictionary(data=DATA).values() for ph in phones}
    used |= set(english.english_g2p(data=DATA)._model.phonemes)
    assert (used & v2) <= kept


# ------------------------------------------------------------------------------ normalisation units


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("He was born in 1987.", "He was born in nineteen eighty-seven."),
        ("in 2005", "in two thousand five"),
        ("in 2010", "in twenty ten"),
        ("in 1905", "in nineteen oh five"),
        ("1,200 students", "twelve hundred students"),
        ("I paid $12.50", "I paid twelve dollars and fifty cents"),
        ("£7.99", "seven pounds and ninety-nine pence"),
        ("$1", "one dollar"),
        ("at 10:30", "at ten thirty a.m."),
        ("at 13:45", "at one forty-five p.m."),
        ("at 4:00", "at four o'clock a.m."),
        ("the 3rd of May", "the third of May"),
        ("ChatGPT", "Chat G P T"),
        ("NASA", "N A S A"),
        ("iPhone", "i Phone"),
        ("Don't worry; everything", "Don't worry everything"),
        ("calm: sunny", "calm sunny"),
        ("1. First item", "first, First item"),
        ("3 + 4 = 7", "three plus four Equals seven"),
        ("60km/h", "sixty kilometersh"),
        ("1km and 1.0km", "one kilometer and one point zero kilometers"),
        ("the 90s", "the ninety seconds"),
        ("to -5°C", "tonegative five degrees celsius"),
        ("75%", "seventy-five percent"),
        ("1/2 and 3/4 and 6/1", "one half and three fourths and six"),
        ("3.25", "three point two five"),
        ("café naïve", "cafe naive"),
        ("e.g. this, i.e. that", "for example this, that is that"),
        ("Wow!! What?!", "Wow! What?"),
        ("“Quoted” — dash", "Quoted  dash"),
    ],
)
def test_documented_normalisations(text, expected):
    from dora_primespeech_mlx.text.english import text_normalize

    assert text_normalize(text) == expected


def test_punctuation_map_is_literal():
    """Upstream re.escape's its map: the bracket entries match only their own literal text."""
    from dora_primespeech_mlx.text.english import text_normalize

    assert text_normalize("a。b！c？") == "a.b!c?"
    assert text_normalize("x[;:：，；]y") == "x,y"
    assert text_normalize('x["’]y') == "x'y"
    assert text_normalize("a , b") == "a  b"  # a mark after whitespace is dropped


def test_normalize_keeps_only_plain_characters():
    out = normalize("Price: 100 € / 50 ¥ ❤️ #tag @me")
    assert set(out) <= set(" ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'.,?!-")
    assert out.startswith("Price one hundred")


# ------------------------------------------------------------------------------------- g2p units


def test_g2p_letters_and_homographs(english):
    g2p = functools.partial(english.g2p, data=DATA)
    assert g2p("A") == ["EY1"]
    assert g2p("a") == ["AH0"]
    # upstream's fixes: "read" tagged VBP reads R IY1 D; "complex" as an adjective K AH0 M P L EH1 K S
    assert g2p("We read books every day.")[2:5] == ["R", "IY1", "D"]
    assert g2p("It is a complex problem.")[5:13] == ["K", "AH0", "M", "P", "L", "EH1", "K", "S"]
    assert g2p("The complex is big.")[2:10] == ["K", "AA1", "M", "P", "L", "EH0", "K", "S"]


def test_g2p_rules(english):
    g2p, cmu = functools.partial(english.g2p, data=DATA), english.english_dictionary(data=DATA)
    assert g2p("'") == ["-"]
    assert g2p("xqz") == cmu["x"] + cmu["q"] + cmu["z"]  # short unknown word is spelled
    assert g2p("OS") == ["OW1", "EH1", "S"]  # removed from the dictionary, so spelled
    assert g2p("conda") == ["K", "AA1", "N", "D", "AH0"]  # engdict-hot.rep
    assert g2p("hello, world.") == cmu["hello"] + [","] + cmu["world"] + ["."]
    word = english.english_g2p(data=DATA).word
    # possessive 's: S after a voiceless consonant, AH0 Z after a sibilant, Z otherwise
    assert word("mailman's") == cmu["mailman"] + ["Z"]
    assert word("bigbox's") == cmu["big"] + cmu["box"] + ["AH0", "Z"]
    assert word("newtrip's") == cmu["new"] + cmu["trip"] + ["S"]
    # compounds: wordsegment splits, each part is looked up
    assert word("sunflowerfield") == cmu["sunflower"] + cmu["field"]


def test_g2p_names_only_for_title_case(english):
    names, cmu = english.name_dictionary(data=DATA), english.english_dictionary(data=DATA)
    name = next(n for n in names if n not in cmu and len(n) > 3 and n.isalpha())
    assert english.english_g2p(data=DATA).word(name.title()) == names[name]


def _upstream_dictionary(folder: Path) -> dict[str, list[str]]:
    """Upstream ``get_dict()``'s parsing as written there (every entry a list), the oracle of the prepared form."""
    words: dict[str, list[str]] = {}
    with open(folder / "cmudict.rep", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if number >= 57:
                fields = line.strip().split("  ")
                words[fields[0].lower()] = fields[1].split(" ")
    for name, override in (("cmudict-fast.rep", False), ("engdict-hot.rep", True)):
        with open(folder / name, encoding="utf-8") as f:
            for line in f:
                fields = line.strip().split(" ")
                if override or fields[0].lower() not in words:
                    words[fields[0].lower()] = fields[1:]
    for word in ("ae", "ai", "ar", "ios", "hud", "os"):
        words.pop(word, None)
    return words


def test_the_prepared_dictionary_is_upstream_s_and_read_back_without_parsing(english, tmp_path, monkeypatch):
    """Every word's phones equal upstream's parsing, parsed the first time and read from the prepared copy in
    the cache folder the next (a damaged copy is parsed again); the folders' TextData without a cache parses."""
    folder = Path(_TEXT_DATA)
    expected = _upstream_dictionary(folder)
    cache = tmp_path / "cache"
    first = english.english_dictionary(data=TextData(folder, folder, cache=cache))
    assert dict(first.items()) == expected
    written = list(cache.glob("english-dict-*.marshal"))
    assert len(written) == 1
    english._english_dictionary.cache_clear()
    parsed = []
    real = english._parse_dictionaries
    monkeypatch.setattr(english, "_parse_dictionaries", lambda *a: parsed.append(a) or real(*a))
    again = english.english_dictionary(data=TextData(folder, folder, cache=cache))
    assert parsed == [] and dict(again.items()) == expected  # read back, not parsed
    english._english_dictionary.cache_clear()
    written[0].write_bytes(b"damaged")
    assert dict(english.english_dictionary(data=TextData(folder, folder, cache=cache)).items()) == expected
    assert len(parsed) == 1
    english._english_dictionary.cache_clear()
    assert dict(english.english_dictionary(data=TextData(folder, folder)).items()) == expected
    english._english_dictionary.cache_clear()


def test_the_g2p_reads_the_prepared_dictionary(english, tmp_path, monkeypatch):
    """The G2P the front end speaks with (``english_g2p``) reads its dictionaries from the prepared copy in the
    data's cache folder, as ``english_dictionary`` does (it once built them without the cache: parsed at every
    start)."""
    folder = Path(_TEXT_DATA)
    cache = tmp_path / "cache"
    english.english_dictionary(data=TextData(folder, folder, cache=cache))  # the prepared copy, written
    english._english_dictionary.cache_clear()
    english._english_g2p.cache_clear()
    parsed = []
    real = english._parse_dictionaries
    monkeypatch.setattr(english, "_parse_dictionaries", lambda *a: parsed.append(a) or real(*a))
    try:
        g2p = english.english_g2p(data=TextData(folder, folder, cache=cache))
        assert parsed == [], "read from the prepared copy, not parsed"
        assert g2p("Hello, 42 quick foxes.") == english.english_g2p(data=DATA)("Hello, 42 quick foxes.")
    finally:
        english._english_dictionary.cache_clear()
        english._english_g2p.cache_clear()


def test_the_tagger_is_prepared_once_and_read_back(english, tmp_path, caplog):
    """NLTK's tagger tags as ``nltk.pos_tag`` does, loaded by NLTK the first time and written prepared, read from
    that copy the next (a copy edited on disk shows through: NLTK's files are not read again); a damaged copy is
    loaded by NLTK again (DEBUG) and rewritten."""
    import logging
    import marshal

    import nltk

    tokens = "The quick brown fox can't read 42 well-known notebooks , he said .".split()
    expected = nltk.pos_tag(tokens)
    assert english.prepared_pos_tag(tmp_path)(tokens) == expected
    (path,) = tmp_path.glob("nltk-tagger-eng-*.marshal")
    assert english.prepared_pos_tag(tmp_path)(tokens) == expected
    weights, tagdict, classes = marshal.loads(path.read_bytes())
    path.write_bytes(marshal.dumps((weights, {**tagdict, "quick": "XX"}, classes)))
    assert english.prepared_pos_tag(tmp_path)(tokens)[1] == ("quick", "XX"), "read from the prepared copy"
    path.write_bytes(b"damaged")
    with caplog.at_level(logging.DEBUG, logger=english.__name__):
        assert english.prepared_pos_tag(tmp_path)(tokens) == expected
    assert any("ignored" in r.getMessage() for r in caplog.records)
    assert english.prepared_pos_tag(tmp_path)(tokens) == expected and marshal.loads(path.read_bytes())
    assert english.prepared_pos_tag(None) is nltk.pos_tag


def test_cold_english_front_end_skips_what_it_does_not_use(english, monkeypatch):
    """A fresh process loads inflect without typeguard's instrumentation (which recompiles inflect's engine class
    at import) and g2p_en's model without NLTK's CMU dictionary (this front end reads upstream's), and its phones
    are those of the checked-in order of lookups (the fixture parity tests above)."""
    import subprocess
    import sys

    probe = (
        "import sys, time\n"
        "from dora_primespeech_mlx.settings import Settings\n"
        "from dora_primespeech_mlx.text.options import TextData\n"
        "from dora_primespeech_mlx.text import english\n"
        "g = english.english_g2p(data=TextData.from_settings(Settings.from_env()))\n"
        "import inflect, typeguard\n"
        "print(len(g._model.cmu), hasattr(inflect.engine.number_to_words, '__wrapped__') or"
        " 'typeguard' in repr(inflect.engine.number_to_words.__code__.co_names))\n"
        "print(g('Hello, 42 quick foxes.'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    first, phones = out.stdout.splitlines()[:2]
    assert first == "0 False", out.stdout  # no NLTK CMU dictionary, no instrumented inflect method
    assert phones == str(english.english_g2p(data=DATA)("Hello, 42 quick foxes."))


# --------------------------------------------------------------------------------------- data layer


def _shared_file(name: str) -> Path:
    path = Path(_TEXT_DATA) / name if _TEXT_DATA else None
    if path is None or not path.is_file():
        _skip_or_fail(f"{name} not found in PRIMESPEECH_TEXT_DATA")
    return path


def _data_in(folder: Path) -> TextData:
    """The front end's data with both folders at ``folder`` (g2pW off)."""
    return TextData(folder, folder)


def test_checksum_mismatch_raises(tmp_path, monkeypatch):
    here = _data_in(tmp_path)
    (tmp_path / "cmudict.rep").write_text("not the dictionary\n")
    with pytest.raises(TextFrontendError, match=r"cmudict\.rep.*sha256.*PRIMESPEECH_TEXT_DATA"):
        data.data_file("cmudict.rep", data=here)


def test_missing_file_without_network_gives_clear_error(tmp_path, monkeypatch):
    here = _data_in(tmp_path)

    def offline(url):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(data, "fetch_url", offline)
    with pytest.raises(TextFrontendError) as info:
        data.data_file("cmudict-fast.rep", data=here)
    msg = str(info.value)
    assert "cmudict-fast.rep" in msg and data.UPSTREAM_COMMIT in msg and "PRIMESPEECH_TEXT_DATA" in msg
    assert list(tmp_path.iterdir()) == []


def test_download_is_verified_and_atomic(tmp_path, monkeypatch):
    good = _shared_file("engdict-hot.rep").read_bytes()
    here = _data_in(tmp_path)
    urls = []
    monkeypatch.setattr(data, "fetch_url", lambda url: urls.append(url) or good + b"tampered")
    with pytest.raises(TextFrontendError, match="expected"):
        data.data_file("engdict-hot.rep", data=here)
    assert list(tmp_path.iterdir()) == []  # nothing half-written or wrong is left behind

    monkeypatch.setattr(data, "fetch_url", lambda url: urls.append(url) or good)
    path = data.data_file("engdict-hot.rep", data=here)
    assert path == tmp_path / "engdict-hot.rep" and path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["engdict-hot.rep"]
    assert urls[-1] == (
        f"https://raw.githubusercontent.com/RVC-Boss/GPT-SoVITS/{data.UPSTREAM_COMMIT}/GPT_SoVITS/text/engdict-hot.rep"
    )


def test_namedict_is_converted_from_the_pickle(tmp_path, monkeypatch):
    names = json.loads(_shared_file("namedict.json").read_text(encoding="utf-8"))
    here = _data_in(tmp_path)
    monkeypatch.setattr(data, "fetch_url", lambda url: pickle.dumps(names, protocol=4))
    path = data.data_file("namedict.json", data=here)
    assert json.loads(path.read_text(encoding="utf-8")) == names


def test_install_file_from_a_local_copy(tmp_path, monkeypatch):
    names = json.loads(_shared_file("namedict.json").read_text(encoding="utf-8"))
    local = tmp_path / "namedict_cache.pickle"
    local.write_bytes(pickle.dumps(names, protocol=4))
    here = _data_in(tmp_path / "data")
    path = data.install_file("namedict.json", local, data=here)
    assert path == tmp_path / "data" / "namedict.json"
    assert data.data_file("namedict.json", data=here) == path
    with pytest.raises(TextFrontendError, match="expected"):
        data.install_file("cmudict.rep", local, data=here)


def test_namedict_unpickler_refuses_code():
    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    with pytest.raises(TextFrontendError, match="refusing"):
        data.namedict_pickle_to_json(pickle.dumps({"x": Evil()}))
    with pytest.raises(TextFrontendError):
        data.namedict_pickle_to_json(pickle.dumps(["not", "a", "dict"]))
    assert data.namedict_pickle_to_json(pickle.dumps({"ann": [("AE1", "N")]})) == b'{"ann":[["AE1","N"]]}'


def test_nltk_data_missing_and_offline_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    monkeypatch.setattr(data, "_nltk_has", lambda resource: False)

    def offline(package, download_dir):
        raise OSError("no network")

    monkeypatch.setattr(data, "nltk_download", offline)
    with pytest.raises(TextFrontendError, match=r"averaged_perceptron_tagger_eng.*NLTK_DATA"):
        data.ensure_nltk_data(data=_data_in(tmp_path))


def test_nltk_data_is_downloaded_into_the_model_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    present: set[str] = set()
    calls = []
    monkeypatch.setattr(data, "_nltk_has", lambda resource: resource in present)

    def download(package, download_dir):
        calls.append((package, download_dir))
        present.update(r for p, r in data.NLTK_PACKAGES if p == package)
        return True

    monkeypatch.setattr(data, "nltk_download", download)
    data.ensure_nltk_data(data=_data_in(tmp_path))
    assert str(tmp_path) in nltk.data.path
    assert calls == [(p, str(tmp_path)) for p, _ in data.NLTK_PACKAGES]
