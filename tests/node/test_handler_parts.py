"""The handler's parts alone, with a fake transport and a fake engine: what is sent (:mod:`.outputs`), the one
answer per text and utterance (:mod:`.answers`), admission to the queue (:mod:`.admission`), reset and barge-in
(:mod:`.cancellation`), speaking a text (:mod:`.speech`), the worker's life (:mod:`.worker`), the input metadata
(:mod:`.inputs`) and ``change_voice`` (:mod:`.controls`)."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dora_primespeech_mlx.dataflow import controls
from dora_primespeech_mlx.dataflow.admission import Admission
from dora_primespeech_mlx.dataflow.answers import Answers
from dora_primespeech_mlx.dataflow.cancellation import CANCELLED, FLUSHED, Canceller
from dora_primespeech_mlx.dataflow.clock import PlaybackClock
from dora_primespeech_mlx.dataflow.inputs import TextMetadata, echoed
from dora_primespeech_mlx.dataflow.intake import Intake
from dora_primespeech_mlx.dataflow.jobs import Job, JobQueue
from dora_primespeech_mlx.dataflow.messages import TextRequest
from dora_primespeech_mlx.dataflow.order import Stamp
from dora_primespeech_mlx.dataflow.outputs import SEND_TRIES, Counts, Outputs
from dora_primespeech_mlx.dataflow.sentences import LlmFeed
from dora_primespeech_mlx.dataflow.speech import Speaker
from dora_primespeech_mlx.dataflow.utterance import Utterance
from dora_primespeech_mlx.dataflow.worker import Worker
from dora_primespeech_mlx.errors import SynthesisError
from dora_primespeech_mlx.settings import Settings

VOICE = SimpleNamespace(name="v", language="en")


class Transport:
    """Records what is sent; ``fail``: how many of the next sends raise."""

    def __init__(self):
        self.sent: list[tuple[str, list, dict]] = []
        self.fail = 0
        self.lock = threading.Lock()

    def send(self, output, array, metadata):
        with self.lock:
            if self.fail:
                self.fail -= 1
                raise RuntimeError("send failed")
            self.sent.append((output, array.to_pylist(), dict(metadata)))

    def of(self, output):
        with self.lock:
            return [(v, m) for o, v, m in self.sent if o == output]

    def outputs(self):
        with self.lock:
            return [o for o, _, _ in self.sent if o != "log"]


def parts(**env):
    settings = Settings.from_env({"LOG_LEVEL": "DEBUG", **env})
    transport, counts = Transport(), Counts()
    out = Outputs(settings, transport, counts, PlaybackClock(), SimpleNamespace(current=VOICE))
    return transport, out, Answers(out)


def text_job(seq=1, text="Hello there.", st=None, **kw):
    return Job("text", {"tid": seq}, seq=seq, stamp=st, request=TextRequest(text=text), **kw)


# -- outputs --------------------------------------------------------------------------------------------
def test_audio_refuses_non_finite_samples_and_never_follows_the_answer():
    transport, out, _ = parts()
    job = text_job()
    with pytest.raises(SynthesisError, match="non-finite"):
        out.audio(job, np.array([0.1, np.nan], np.float32), 32000, VOICE, "en", 0, True, False, None)
    assert transport.of("audio") == []
    assert out.audio(job, np.zeros(3200, np.float32), 32000, VOICE, "en", 0, False, True, 2.0) == pytest.approx(0.1)
    assert out.clock.until is not None
    job.claim()
    out.audio(job, np.zeros(3200, np.float32), 32000, VOICE, "en", 1, True, True, None)
    ((samples, md),) = transport.of("audio")
    assert md["tid"] == 1 and md["chunk_index"] == 0 and md["is_streaming"] is True and len(samples) == 1


def test_flush_marks_exactly_the_next_audio_and_the_format_is_followed():
    transport, out, _ = parts(AUDIO_FORMAT="flat")
    out.flush_next()
    for i in range(2):
        out.emit_audio(np.zeros(4, np.float32), {"i": i})
    (first, second) = transport.of("audio")
    assert first[1].get("flush") is True and "flush" not in second[1]
    assert len(first[0]) == 4  # flat: the samples themselves


def test_answers_are_retried_and_counted_and_logs_respect_the_level():
    transport, out, _ = parts(LOG_LEVEL="WARNING")
    transport.fail = SEND_TRIES - 1
    out.answer({"tid": 1}, "error", "bad", "text", "text #1")
    ((value, md),) = transport.of("segment_complete")
    assert value == ["error"] and md["error"] == "bad" and md["error_stage"] == "text"
    assert out.counts["errors"] == 1
    out.log("INFO", "hidden")
    transport.fail = 1
    out.log("ERROR", "lost, and no exception")  # a failing log never raises
    out.log("WARNING", "shown")
    assert [json.loads(v[0])["message"] for v, _ in transport.of("log")] == ["shown"]


def test_silence_only_when_asked():
    transport, out, _ = parts(SILENCE_ON_SKIP="false")
    out.silence(text_job())
    assert transport.of("audio") == []
    utterance = Utterance(("s", "1"), {"session_id": "s"}, None, LlmFeed(None))
    utterance.closed = True
    out.silence(None, utterance, always=True)
    ((samples, md),) = transport.of("audio")
    assert md["silent"] is True and md["fin"] is True and md["seq"] == 0 and not any(samples[0])


# -- answers --------------------------------------------------------------------------------------------
def test_a_text_is_answered_once_silence_and_status_before_its_answer():
    transport, _, answers = parts()
    job = text_job()
    assert answers.fail(job, "broken", "text")
    assert not answers.fail(job, "again", "text") and not answers.complete(job, "completed")
    assert transport.outputs() == ["audio", "status", "segment_complete"]
    other = text_job(2)
    assert answers.complete(other, "completed", lambda: 1 / 0)  # what precedes it fails: the answer goes out
    assert [v for v, _ in transport.of("segment_complete")] == [["error"], ["completed"]]


def test_an_utterance_is_answered_once_all_its_sentences_are_and_it_is_closed():
    transport, _, answers = parts()
    utterance = Utterance(("s", "1"), {"session_id": "s"}, None, LlmFeed(None))
    utterance.sentences = 2
    jobs = [text_job(i, utterance=utterance, part=i) for i in range(3)]
    assert not answers.fail(jobs[2], CANCELLED, "reset")  # cancelled with its utterance: its utterance answers
    assert transport.sent == []
    assert answers.fail(jobs[0], "broken", "text")  # its status, no answer of its own
    answers.complete(jobs[1], "completed")
    assert transport.of("segment_complete") == [] and len(transport.of("status")) == 1
    utterance.closed = True
    answers.closed(utterance)
    answers.closed(utterance)
    ((value, md),) = transport.of("segment_complete")
    assert value == ["completed"] and md["session_id"] == "s"
    assert transport.of("audio")[-1][1]["fin"] is True  # its last audio had not said fin: a closing chunk


# -- admission and cancellation -------------------------------------------------------------------------
def test_admission_checks_once_and_answers_busy_and_stopping_at_once():
    transport, out, answers = parts(MAX_TEXT_CHARS="5")
    jobs, stopping = JobQueue(max_texts=1), threading.Event()
    admission = Admission(jobs, answers, None, stopping)
    a, b, c = (text_job(admission.next_seq(), "Hi.") for _ in range(3))
    admission.admit(a)
    admission.admit(b)
    stopping.set()
    admission.admit(c)
    assert jobs.queued() == [a] and not a.skip
    errors = [md["error_stage"] for _, md in transport.of("segment_complete")]
    assert errors == ["busy", "stop"] and out.counts["busy"] == 1 and out.counts["texts"] == 3
    stopping.clear()
    long = text_job(admission.next_seq(), "Far too long.")
    admission.parse(long, "Far too long.")
    assert long.error is None
    jobs.get(0)
    jobs.done()
    admission.admit(long)
    assert "MAX_TEXT_CHARS=5" in long.error


def test_a_text_is_refused_on_arrival_when_stopping_cancelled_or_over_the_bound():
    transport, out, answers = parts()
    jobs, stopping = JobQueue(max_texts=2), threading.Event()
    admission = Admission(jobs, answers, None, stopping)
    jobs.put(text_job(1))
    assert not admission.refused(text_job(2), None, 0)
    assert admission.refused(text_job(3), None, 1)
    assert admission.refused(text_job(4), (CANCELLED, "reset"), 0)
    stopping.set()
    assert admission.refused(text_job(5), None, 0)
    assert [md["error_stage"] for _, md in transport.of("segment_complete")] == ["busy", "reset", "stop"]
    assert (out.counts["texts"], out.counts["busy"], out.counts["cancelled"]) == (3, 1, 1)


def test_reset_and_barge_in_cancel_what_was_sent_before_them():
    transport, out, answers = parts()
    jobs = JobQueue()
    admission = SimpleNamespace(parse=lambda j, r: None, admit=jobs.put, sentence=lambda u, s: None)
    intake = Intake(admission, answers, llm_text=False, idle_s=5.0)
    canceller = Canceller(intake, jobs, answers, None, out.clock)
    early, late = text_job(1, st=Stamp(1.0, None, 1)), text_job(2, st=Stamp(3.0, None, 3))
    jobs.put(early)
    jobs.put(late)
    out.clock.sent(1.0)
    canceller.reset({"r": 1}, Stamp(2.0, None, 2))
    assert jobs.queued() == [late] and out.clock.until is None
    assert canceller.marks.cancelled(Stamp(1.5, None, 4)) == (CANCELLED, "reset")
    (status,) = [json.loads(v[0]) for v, _ in transport.of("status") if json.loads(v[0])["status"] == "reset"]
    assert status["cancelled"] == 1 and out.counts["cancelled"] == 1
    canceller.barge_in({"flush": True, "seq": 0}, Stamp(4.0, None, 5), None)
    assert jobs.queued() == [] and canceller.marks.cancelled(Stamp(3.5, None, 6)) == (FLUSHED, "flush")
    flush = [m for v, m in transport.of("status") if json.loads(v[0])["status"] == "flush"]
    assert flush == [{}]  # the convention keys are not echoed
    out.emit_audio(np.zeros(2, np.float32), {})
    assert transport.of("audio")[-1][1]["flush"] is True
    assert [md["error_stage"] for _, md in transport.of("segment_complete")] == ["reset", "flush"]


# -- speaking a text ------------------------------------------------------------------------------------
class Engine:
    def __init__(self, audio):
        self.audio = audio
        self.upcoming = None

    def synthesize_stream(self, text, voice, cancel, listener, **overrides):
        self.upcoming = listener.upcoming()
        for i, chunk in enumerate(self.audio):
            yield SimpleNamespace(audio=chunk, sample_rate=32000, chunk_index=i, is_final=i == len(self.audio) - 1)


def speaker(engine, **env):
    transport, out, answers = parts(STREAMING="true", **env)
    voices = SimpleNamespace(for_request=lambda req, st=None: VOICE)
    sp = Speaker(voices, answers, engine=engine)
    return transport, JobQueue(on_change=sp.publish), sp


def test_a_text_is_spoken_chunk_by_chunk_and_those_behind_it_are_offered():
    engine = Engine([np.zeros(320, np.float32)] * 2)
    transport, jobs, sp = speaker(engine)
    behind, skipped = text_job(2, "Next."), text_job(3, "...", skip=True)
    jobs.put(behind)
    jobs.put(skipped)
    sp.run(text_job(1))
    assert transport.outputs() == ["status", "audio", "audio", "status", "segment_complete"]
    assert [u.key for u in engine.upcoming] == [2]
    done = json.loads(transport.of("status")[-1][0][0])
    assert done["status"] == "done" and done["chunks"] == 2


def test_the_board_the_engine_reads_follows_the_queue_and_the_playback_clock():
    """The node pushes data, the engine reads it: the texts queued (up to the first control, without those that
    will be skipped) are on the board after every put, get and take, none before the engine is built; the clock's
    ``playing_until`` after every send and reset."""
    transport, out, answers = parts(STREAMING="true")
    voices = SimpleNamespace(for_request=lambda req, st=None: VOICE)
    sp = Speaker(voices, answers)
    jobs = JobQueue(on_change=sp.publish)
    board, listener = sp.board, sp.board.listener(9)
    assert board is out.clock.board and listener.key == 9
    jobs.put(text_job(1))
    assert listener.upcoming() == ()  # no engine yet: nothing to offer
    sp.engine = object()
    jobs.put(text_job(2))
    jobs.put(text_job(3, "...", skip=True))
    jobs.put(text_job(4))
    jobs.put(Job("control", {}, command=SimpleNamespace(name="change_voice")))
    jobs.put(text_job(5))
    assert [u.key for u in listener.upcoming()] == [1, 2, 4]
    assert jobs.get(0.1).seq == 1
    assert [u.key for u in listener.upcoming()] == [2, 4]
    jobs.take(("text",), spare=lambda job: job.seq != 2)
    assert [(u.key, u.text, u.voice) for u in listener.upcoming()] == [(4, "Hello there.", VOICE)]
    assert listener.playing_until() is None
    out.clock.sent(2.0)
    until = listener.playing_until()
    assert until is not None and until == out.clock.until
    out.clock.forget()
    assert listener.playing_until() is None


def test_non_finite_audio_answers_the_text_with_an_error():
    transport, _, sp = speaker(Engine([np.full(320, np.inf, np.float32)]), SILENCE_ON_SKIP="false")
    sp.run(text_job(1))
    ((value, md),) = transport.of("segment_complete")
    assert value == ["error"] and md["error_stage"] == "sovits" and transport.of("audio") == []


# -- the worker -----------------------------------------------------------------------------------------
def test_the_worker_answers_an_internal_error_and_is_replaced_when_it_dies():
    jobs, ran, failed, counted = JobQueue(), [], [], []
    deaths = [SystemExit("dies"), ValueError("bug")]

    def run(job):
        ran.append((job.seq, threading.current_thread().name))
        if job.seq <= 2:
            raise deaths[job.seq - 1]

    answers = SimpleNamespace(fail=lambda job, error, stage: failed.append((job.seq, stage)),
                              out=SimpleNamespace(log=lambda level, message: None,
                                                  counts=SimpleNamespace(add=counted.append)))
    worker = Worker(jobs, lambda: None, run, answers)
    worker.start()
    for seq in (1, 2, 3):
        jobs.put(text_job(seq))
    assert worker.ready.wait(5) and worker.startup_error is None
    assert jobs.wait_idle(10)
    assert [seq for seq, _ in ran] == [1, 2, 3] and {name for _, name in ran} == {"primespeech-worker"}
    assert (1, "node") in failed and (2, "node") in failed and counted == ["worker_restarts"]
    jobs.close()
    assert worker.parked.wait(5)
    worker.stopping.set()


def test_a_failed_build_is_kept_and_a_stalled_queue_is_reported():
    jobs = JobQueue()
    answers = SimpleNamespace(fail=lambda *a: True, out=SimpleNamespace(log=lambda *a: None,
                                                                        counts=SimpleNamespace(add=lambda name: None)))
    worker = Worker(jobs, lambda: 1 / 0, lambda job: None, answers)
    worker.start()
    assert worker.ready.wait(5) and isinstance(worker.startup_error, ZeroDivisionError)
    jobs.put(text_job())
    t0 = time.monotonic()
    assert not worker.drained(0.1)  # nothing runs the job
    assert time.monotonic() - t0 < 5
    worker.stopping.set()


# -- input metadata and change_voice --------------------------------------------------------------------
def test_metadata_is_echoed_without_the_send_timestamp_and_a_bad_index_is_reported_once():
    assert echoed({"timestamp": 5, "a": 1}) == {"a": 1}
    logs = []
    meta = TextMetadata(lambda level, message: logs.append(level))
    for _ in range(2):
        md = meta.read({"segment_index": "x"}, 1)
    assert md["question_id"] == "default" and md["session_status"] == "unknown"
    assert logs == ["WARNING"]


def test_change_voice_keeps_the_old_voice_on_failure_and_clears_resolved_voices():
    statuses, jobs = [], JobQueue()
    queued = text_job(voice=VOICE)
    jobs.put(queued)
    new = SimpleNamespace(name="w", language="zh")

    def change(name, engine, st):
        if name == "bad":
            raise ValueError("no such voice")
        return new, VOICE

    voices = SimpleNamespace(current=VOICE, change=change)
    status = lambda s, md, **kw: statuses.append((s, kw.get("voice")))  # noqa: E731
    controls.change_voice("bad", {}, None, voices, None, jobs, status, lambda *a: None)
    assert statuses == [("error", "v")] and queued.voice is VOICE
    controls.change_voice("w", {}, None, voices, None, jobs, status, lambda *a: None)
    assert statuses[-1] == ("voice_changed", "w") and queued.voice is None
