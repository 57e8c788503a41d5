"""Continuous batching of the GPT's decode: sentences of one voice that wait for their turn decode together.

A decode step on the CPU is bound by memory (it reads every block weight once per token), so a second row in
the same step costs little: :func:`~.generate.step_together` reads each weight once for all rows. A
:class:`DecodeBatch` holds the rows (each a :class:`~.generate.Generation`, prefilled when it joins) and
steps them all whenever the sentence that is read needs its next token; the others' tokens wait in their
rows. Rows join at any step and leave when they stop (EOS, early stop, step cap) or are dropped.

Each row's tokens are exactly its decode alone with the same seed: its own noise source, repetition-penalty
state and KV cache, and a batched step computes every row's logits bit for bit as a step alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .generate import Generation, step_together


class Row:
    """One sentence in a :class:`DecodeBatch`: its generation and the tokens decoded but not yet read."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.ready: deque[int] = deque()
        self.finished = False  # the generation stopped: nothing more comes after ``ready``
        self.stop_reason: str | None = None
        self.steps = 0  # decode steps this row took part in (its tokens, the stopping one included)


class DecodeBatch:
    """Rows decoded together, at most ``max_rows`` of them stepping at once (1: one after another)."""

    def __init__(self, max_rows: int = 4):
        if max_rows < 1:
            raise ValueError(f"a decode batch needs at least one row, got {max_rows}")
        self.max_rows = max_rows
        self.rows: list[Row] = []  # in arrival order; the finished ones leave at the next step
        self.steps = 0  # batched steps taken
        self.row_steps = 0  # rows stepped, summed over the steps (rows_steps / steps = the mean batch)

    @property
    def active(self) -> list[Row]:
        return [r for r in self.rows if not r.finished]

    @property
    def room(self) -> int:
        """How many more rows can join now."""
        return self.max_rows - len(self.active)

    def add(self, gen: Generation) -> Row:
        """A prefilled generation joins: it steps with the others from the next step on."""
        row = Row(gen)
        self.rows.append(row)
        return row

    def drop(self, row: Row) -> None:
        """Stop decoding ``row`` (its sentence was cancelled or is no longer wanted)."""
        row.finished = True
        if row in self.rows:
            self.rows.remove(row)

    def step(self) -> None:
        """One decode step for every active row that fits (the oldest first): each chooses its token from the
        logits at hand; those that go on compute their next logits in one batched step."""
        rows = self.active[: self.max_rows]
        going: list[Row] = []
        for row in rows:
            s = row.gen.choose()
            row.steps += 1
            if s.keep:
                row.ready.append(s.token)
            if s.stop is not None:
                row.finished, row.stop_reason = True, s.stop
            else:
                going.append(row)
        if going:
            step_together([r.gen for r in going])
        self.steps += 1
        self.row_steps += len(rows)
        self.rows = [r for r in self.rows if not r.finished or r.ready]

    def tokens(self, row: Row) -> Iterator[int]:
        """``row``'s tokens one at a time: those already decoded first, then stepping the batch (all its rows)
        until ``row`` has the next one or stops. Stop iterating to leave the row to others (:meth:`drop` ends
        it)."""
        while True:
            if row.ready:
                yield row.ready.popleft()
                continue
            if row.finished:
                if row in self.rows:
                    self.rows.remove(row)
                return
            if row not in self.active[: self.max_rows]:  # a row beyond the batch's width waits its turn
                self._make_room_for(row)
            self.step()

    def _make_room_for(self, row: Row) -> None:
        """Put ``row`` among the rows that step (the one being read must advance)."""
        self.rows.remove(row)
        self.rows.insert(0, row)
