"""Turn the byte chunks read from a rank's pipe into whole text lines.

Carriage returns are resolved as a terminal would: only the text after the last ``\\r`` of a
line is kept, so a progress bar redrawn a thousand times becomes one line (its final state).

Example:
    >>> splitter = LineSplitter()
    >>> splitter.feed(b"a\\nb")
    ['a']
    >>> splitter.feed(b" 10%\\r 100%\\n")
    [' 100%']
    >>> splitter.flush()
    []
"""

from __future__ import annotations

import codecs

_MAX_PENDING = 1 << 20  # a "line" that never ends is cut here rather than growing without bound


class LineSplitter:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def feed(self, chunk: bytes) -> list[str]:
        text = self._pending + self._decoder.decode(chunk)
        lines = text.split("\n")
        self._pending = _last_redraw(lines.pop())
        if len(self._pending) > _MAX_PENDING:
            lines.append(self._pending)
            self._pending = ""
        return [_last_redraw(line) for line in lines]

    def flush(self) -> list[str]:
        """The unterminated last line, if any (at the end of the rank's output)."""
        rest = _last_redraw(self._pending + self._decoder.decode(b"", final=True))
        self._pending = ""
        return [rest] if rest else []

    @property
    def partial(self) -> str:
        """The line being written now (no newline yet), as a terminal would show it."""
        return self._pending


def _last_redraw(line: str) -> str:
    line = line.removesuffix("\r")  # "\r\n" line endings
    cut = line.rfind("\r")
    return line if cut < 0 else line[cut + 1 :]
