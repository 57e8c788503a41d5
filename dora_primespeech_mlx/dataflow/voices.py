"""Which voice each text is spoken with: the node's current voice, a per-request voice (``VOICE:<name>|``,
``VOICE:CUSTOM|...``, ``VOICE:TRAINED|...``), and ``change_voice`` in send order (a text sent before a change
speaks with the voice before it, even when it arrives after the change ran)."""

from __future__ import annotations

from typing import Any

from ..assets.catalog import catalog_options, custom_voice, resolve_voice
from ..paths import request_roots
from .messages import TextRequest

VOICE_LOG = 16  # voice changes remembered for texts that arrive after a change_voice sent later than them


class Voices:
    """The current voice (``current``, a VoiceSpec) and the recent changes, resolved against ``settings``."""

    def __init__(self, settings):
        self.settings = settings
        self.current: Any = None
        self._log: list[tuple[Any, Any]] = []  # (change_voice's stamp, the voice before it)

    def at(self, st: Any):
        """The voice for a text sent at ``st``: the current one, unless a change_voice sent after the text has
        already run (the text arrived late), then the voice before the earliest such change."""
        if st is not None:
            for changed_at, previous in self._log:
                if changed_at is not None and st.before(changed_at):
                    return previous
        return self.current

    def for_request(self, req: TextRequest, st: Any = None):
        """The voice ``req`` is spoken with; raises VoiceNotFoundError / VoiceNotInstalledError / ConfigError."""
        choice = req.voice
        if choice is None:
            return self.at(st)
        root = self.settings.model_dir
        if choice.kind == "name":
            if choice.name == self.current.name:
                return self.current
            return resolve_voice(choice.name, root, **catalog_options(self.settings))
        # CUSTOM: zero-shot cloning with the current voice's weights (Doubao by default, as the old node);
        # TRAINED: own weights, the current voice's encoders.
        roots = request_roots(root, self.settings.voices_dir, self.settings.request_paths)
        return custom_voice(choice.reference, choice.prompt_text or "", choice.lang or "auto",
                            gpt=choice.gpt, sovits=choice.sovits, base=self.current, root=root, roots=roots,
                            **catalog_options(self.settings))

    def change(self, name: str, engine, st: Any = None):
        """Load voice ``name`` into ``engine`` and make it current; returns (new, old). On any failure the old
        voice stays current and the exception propagates."""
        old = self.current
        spec = resolve_voice(name, self.settings.model_dir, **catalog_options(self.settings))
        engine.load_voice(spec)
        self.current = spec
        self._log = [*self._log, (st, old)][-VOICE_LOG:]
        return spec, old
