"""Progress of long command-line work on stderr: one updating line on a terminal, plain lines
elsewhere.

On a terminal the line names the current phase ("compiling the JAX program", "running 1 lane",
"writing results.json") and the seconds spent in it, rewritten in place twice a second by a
background thread, so a minute-long compile is visibly alive. When stderr is a file or a pipe
(scripts, CI logs, notebooks) each phase is one plain line when it starts, with the seconds the
previous phase took (no carriage returns). ``--quiet`` turns both off. Nothing runs inside the
compiled JAX loop; phases are announced by the host code around it.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

#: Seconds between redraws of the line.
TICK_S = 0.5


class Progress:
    """One status line ``blisjax: <phase> … <seconds> s`` on ``stream``, updated in place.

    Use as a context manager; :meth:`phase` starts a new phase (its clock restarts), leaving the
    context clears the line. On a stream that is not a terminal each phase is a plain line
    instead. Disabled (every method a no-op) when ``enabled`` is False.
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self._text = ""
        self._phase_start_s = time.monotonic()
        self._width = 0  # characters of the line last drawn, to blank its remainder
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def phase(self, text: str) -> None:
        """Show ``text`` as the current phase, its elapsed time counting from now."""
        if not self.enabled:
            return
        if not self.tty:
            now = time.monotonic()
            after = f" (after {now - self._phase_start_s:.0f} s of {self._text})" \
                if self._text else ""
            self._text, self._phase_start_s = text, now
            print(f"blisjax: {text}{after}", file=self.stream, flush=True)
            return
        with self._lock:
            self._text = text
            self._phase_start_s = time.monotonic()
        self._draw()
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="blisjax-progress",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the ticker and blank the line (the next output starts on a clean line)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.enabled and self._width:
            with self._lock:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
                self._width = 0

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            elapsed_s = time.monotonic() - self._phase_start_s
            line = f"blisjax: {self._text} … {elapsed_s:.0f} s"
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self.stream.flush()
            self._width = len(line)
