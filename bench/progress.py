"""A one-line progress display on stderr: which model, which engine, elapsed time."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``[3/20] resnet50 b8: onnxruntime round 2/3  (41 s)``, rewritten in place on a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.index = 0
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.tty = self.stream.isatty()

    def _write(self, text: str, final: bool = False) -> None:
        line = f"[{self.index}/{self.total}] {text}  ({time.perf_counter() - self.start:.0f} s)"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        elif final:
            self.stream.write(line + "\n")
        self.stream.flush()

    def next(self, label: str) -> None:
        self.index += 1
        self._write(label)

    def stage(self, text: str) -> None:
        self._write(text)

    def done(self, text: str) -> None:
        self._write(text, final=True)
