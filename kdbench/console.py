"""Console output that cannot kill a run.

A run may outlive whatever reads its output: the terminal closes, the ``tee`` or the script that
launched it is killed. Writing to the dead pipe then raises ``BrokenPipeError`` (or ``OSError``
EIO for a vanished terminal) from inside a progress bar or a log call, and hours of training would
end as a failed record. :class:`DetachableStream` swallows that error and discards the stream's
later output instead; the run folder's ``train.log`` keeps the whole log either way.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any, TextIO

RUN_LOGGER = "kdbench.run"  # a run's progress lines: to its train.log (kdbench.engine.run_log attaches the file)

GONE_ERRNOS = (errno.EPIPE, errno.EIO, errno.ENXIO)


class DetachableStream:
    """A text stream that goes quiet, instead of raising, once its reader is gone."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.detached = False

    def write(self, text: str) -> int:
        if not self.detached:
            try:
                return self._stream.write(text)
            except OSError as error:
                self._detach_on(error)
        return len(text)

    def flush(self) -> None:
        if not self.detached:
            try:
                self._stream.flush()
            except OSError as error:
                self._detach_on(error)

    def isatty(self) -> bool:
        return not self.detached and self._stream.isatty()

    def _detach_on(self, error: OSError) -> None:
        if not isinstance(error, BrokenPipeError) and error.errno not in GONE_ERRNOS:
            raise error
        self.detached = True
        # Point the descriptor at /dev/null too, so the interpreter's own flush at exit (and any
        # child process) finds a writable stream rather than the dead pipe.
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, buffer, ...: the wrapped stream's
        return getattr(self._stream, name)


def protect_console() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once) so a lost reader never fails the process."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, DetachableStream):
            setattr(sys, name, DetachableStream(stream))
