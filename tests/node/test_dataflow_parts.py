"""The handler's parts alone: sentence cutting and the LLM feed (:mod:`.sentences`), an utterance's fragment order
and chunk numbering (:mod:`.utterance`), the intake (:mod:`.intake`), the work queue's ``take``, the playback
clock, voices in send order and the control answers."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dora_primespeech_mlx.dataflow import controls
from dora_primespeech_mlx.dataflow.clock import PlaybackClock
from dora_primespeech_mlx.dataflow.intake import Intake
from dora_primespeech_mlx.dataflow.jobs import Job, JobQueue
from dora_primespeech_mlx.dataflow.messages import ControlCommand, TextRequest
from dora_primespeech_mlx.dataflow.order import Stamp
from dora_primespeech_mlx.dataflow.sentences import MAX_SENTENCE_CHARS, LlmFeed, SentenceCutter
from dora_primespeech_mlx.dataflow.utterance import MAX_HELD_FRAGMENTS, Fragment, Utterance, convention
from dora_primespeech_mlx.dataflow.voices import Voices
from dora_primespeech_mlx.text import llm

TEXTS = [
    "Hello there! Pi is 3.14 today. See example.com now.\n\nHere is how:\n1. Update numpy to 2.0\n2. Restart it",
    "<think>I think. Yes.</think>**Bold** words. A [link](https://x.example.com) here. Done",
    '你好。我们走吧！"Quoted." He said \'no.\' Ok... then? Fine',
    "- one item\n- two items\n\n| a | b |\n|---|---|\n| 1. x | 2 |\nEnd.",
    "```python\nprint('no. really.')\n```\nAfter the code. `inline. code` stays. Last",
]


def sentences(text: str, cuts: list[int], llm_text: bool = True) -> list[str]:
    feed = LlmFeed(llm.StreamFilter() if llm_text else None)
    cutter = SentenceCutter()
    out, start = [], 0
    for end in [*sorted(set(cuts)), len(text)]:
        out += cutter.push(feed.push(text[start:end]))
        start = end
    return out + cutter.push(feed.finish()) + cutter.finish()


def test_sentences_are_cut_at_sentence_ends_and_lines():
    assert sentences(TEXTS[0], []) == ["Hello there!", "Pi is 3.14 today.", "See example.com now.", "Here is how:",
                                       "Update numpy to 2.0", "Restart it"]  # list numbers dropped (text/llm.py)
    assert sentences(TEXTS[2], [], llm_text=False) == ["你好。", "我们走吧！", '"Quoted."', "He said 'no.'",
                                                       "Ok...", "then?", "Fine"]
    assert sentences(TEXTS[1], []) == ["Bold words.", "A link here.", "Done"]


@pytest.mark.parametrize("llm_text", [True, False])
def test_a_full_width_sentence_goes_when_the_next_character_comes(llm_text):
    """Chinese and Japanese sentences end with no space after them: each is complete, and goes out, as soon as the
    next character (not a closer) is there, not at the end of the line or the utterance."""
    text = "今天的天气特别好。我们一起去公园里散步吧！他说：“好。”然后走了。"
    feed, cutter = LlmFeed(llm.StreamFilter() if llm_text else None), SentenceCutter()
    released = {}
    for k, ch in enumerate(text):
        for sentence in cutter.push(feed.push(ch)):
            released[sentence] = k
    rest = cutter.push(feed.finish()) + cutter.finish()
    assert released == {"今天的天气特别好。": text.index("我"), "我们一起去公园里散步吧！": text.index("他"),
                        "他说：“好。”": text.index("然")}
    assert rest == ["然后走了。"]


def test_a_run_without_a_sentence_end_is_cut():
    text = ("word, " * 200).strip()
    out = sentences(text, [], llm_text=False)
    assert len(out) > 1 and all(len(s) <= MAX_SENTENCE_CHARS + 1 for s in out)
    assert " ".join(out) == text


@settings(max_examples=200, deadline=None)
@given(which=st.integers(0, len(TEXTS) - 1), cuts=st.lists(st.integers(0, 200), max_size=60),
       llm_text=st.booleans())
def test_sentences_do_not_depend_on_how_the_text_was_cut(which, cuts, llm_text):
    text = TEXTS[which]
    assert sentences(text, [c % (len(text) + 1) for c in cuts], llm_text) == sentences(text, [], llm_text)


def test_a_sentence_is_held_until_the_character_after_its_end_is_known():
    cutter = SentenceCutter()
    assert cutter.push("It costs 3.") == []  # 3.5 or the end of a sentence
    assert cutter.push("5 euros. And") == ["It costs 3.5 euros."]
    assert cutter.finish() == ["And"]


def test_fragments_are_put_in_seq_order_and_gaps_are_bounded():
    u = Utterance(("s", "1"), {}, None, LlmFeed(None))
    assert u.accept(Fragment("b", 1, False)) == []
    assert [f.text for f in u.accept(Fragment("a", 0, False))] == ["a", "b"]
    assert u.accept(Fragment("a again", 0, False)) == []  # a repeat is dropped
    assert [f.text for f in u.accept(Fragment("x", None, False))] == ["x"]  # no seq: in arrival order
    held = [u.accept(Fragment(str(n), n, False)) for n in range(3, 3 + MAX_HELD_FRAGMENTS + 1)]
    assert held[:-1] == [[]] * MAX_HELD_FRAGMENTS  # seq 2 never comes
    assert [f.text for f in held[-1]] == [str(n) for n in range(3, 3 + MAX_HELD_FRAGMENTS + 1)]
    assert u.skipped_gaps == 1


def test_chunks_are_numbered_and_fin_marks_the_last():
    u = Utterance(("s", "1"), {}, None, LlmFeed(None))
    u.sentences = 2
    assert u.chunk_metadata(True, 0) == {"seq": 0, "fin": False}
    assert u.chunk_metadata(True, 1) == {"seq": 1, "fin": False}  # not closed yet: more may come
    u.closed = True
    assert u.chunk_metadata(False, 1) == {"seq": 2, "fin": False}
    assert u.chunk_metadata(True, 1) == {"seq": 3, "fin": True}
    assert u.chunk_metadata(True, None) == {"seq": 4, "fin": False}  # fin only once


def test_convention_keys():
    assert convention({"segment_id": 3, "seq": 2, "fin": True, "flush": True}) == (3, 2, True, True)
    assert convention({"seq": True, "fin": "yes"}) == (None, None, False, False)


def test_intake_assembles_utterances_off_the_calling_thread_and_ends_idle_ones():
    got, closed, threads = [], [], set()

    def admit_sentence(u, s):
        threads.add(threading.current_thread().name)
        got.append((u.key, s))

    admission = SimpleNamespace(parse=lambda job, raw: None, admit=lambda job: None, sentence=admit_sentence)
    answers = SimpleNamespace(closed=closed.append, out=SimpleNamespace(log=lambda lv, m: None))
    intake = Intake(admission, answers, llm_text=True, idle_s=0.2)
    intake.start()
    try:
        for n, part in enumerate(["<thi", "nk>x</th", "ink>Hel", "lo. Bye"]):
            intake.put_fragment(("s", "1"), {"segment_id": 1}, None, Fragment(part, n, False))
        deadline = time.monotonic() + 5
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [(("s", "1"), "Hello."), (("s", "1"), "Bye")]
        assert threads == {"primespeech-intake"}
        assert closed[0].closed and closed[0].sentences == 2 and intake.pending() == 0
    finally:
        intake.stop()


def test_intake_take_removes_what_was_sent_before_a_stamp():
    admission = SimpleNamespace(parse=lambda job, raw: None, admit=lambda job: None, sentence=lambda u, s: None)
    answers = SimpleNamespace(closed=lambda u: None, out=SimpleNamespace(log=lambda lv, m: None))
    intake = Intake(admission, answers, llm_text=False, idle_s=10)
    early, late = Stamp(None, None, 1), Stamp(None, None, 5)
    intake.put_text(Job("text", {}, stamp=early), "a")
    intake.put_text(Job("text", {}, stamp=late), "b")
    intake.put_fragment(("s", "1"), {}, early, Fragment("x", 0, False))
    intake.put_fragment(("s", "2"), {}, early, Fragment("y", 0, False))
    with intake.hold():
        jobs, utterances = intake.take(Stamp(None, None, 3), keep=("s", "2"))
    assert [j.stamp for j in jobs] == [early] and [u.key for u in utterances] == [("s", "1")]  # arrived: answered
    assert intake.forgotten(("s", "1")) and not intake.forgotten(("s", "2"))
    assert intake.queued_texts() == 1
    with intake.hold():  # no utterance to keep: every text sent before the stamp
        jobs, _ = intake.take(Stamp(None, None, 9))
    assert [j.stamp for j in jobs] == [late] and intake.queued_texts() == 0


def test_job_queue_take_spares_what_it_is_told_to():
    q = JobQueue()
    a, b = Job("text", {"n": 1}), Job("text", {"n": 2})
    q.put(a)
    q.put(b)
    taken, current = q.take(("text",), None, lambda j: j.metadata["n"] == 2)
    assert taken == [a] and current is None and q.queued() == [b]


def test_playback_clock():
    clock = PlaybackClock()
    assert clock.until is None
    t0 = time.perf_counter()
    clock.sent(1.0)
    clock.sent(0.5)
    assert clock.until >= t0 + 1.5
    clock.forget()
    assert clock.until is None


def test_voices_follow_send_order():
    voices = Voices(SimpleNamespace(model_dir=None, voices_dir=None, voice_unknown_keys="error"))
    old = SimpleNamespace(name="Old", language="en")
    voices.current = old
    new = SimpleNamespace(name="New", language="en")
    import dora_primespeech_mlx.dataflow.voices as catalog  # where Voices resolves names

    loaded = []
    engine = SimpleNamespace(load_voice=loaded.append)
    orig = catalog.resolve_voice
    catalog.resolve_voice = lambda name, root=None, **kw: new
    try:
        assert voices.change("New", engine, Stamp(None, None, 5)) == (new, old)
    finally:
        catalog.resolve_voice = orig
    assert loaded == [new] and voices.current is new
    assert voices.at(Stamp(None, None, 3)) is old  # sent before the change, arrived after it
    assert voices.at(Stamp(None, None, 7)) is new
    assert voices.for_request(TextRequest(text="x"), Stamp(None, None, 3)) is old


def test_control_answers_and_their_errors():
    sent = []

    def status(name, md, **fields):
        sent.append((name, fields))

    engine = SimpleNamespace(stats=lambda: {"n": 1}, list_voices=lambda: [{"name": "A"}], cleanup=lambda: {"f": 2})
    voice = SimpleNamespace(name="A")
    counts = {"texts": 3}
    for name in ("stats", "list_voices", "cleanup"):
        controls.answer(ControlCommand(name), {}, engine, voice, counts, 0, status, lambda lv, m: None)
    assert [n for n, _ in sent] == ["stats", "voices", "cleanup"]
    engine.stats = lambda: 1 / 0
    controls.answer(ControlCommand("stats"), {}, engine, voice, counts, 0, status, lambda lv, m: None)
    assert sent[-1][0] == "error" and sent[-1][1]["command"] == "stats"
    json.dumps(controls.jsonable({"a": SimpleNamespace(), "b": (1, 2.0)}))


@pytest.mark.parametrize("text", ["", "   ", "\n\n"])
def test_nothing_to_cut(text):
    assert sentences(text, []) == []
