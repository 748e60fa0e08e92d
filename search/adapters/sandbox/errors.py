"""What a sandboxed run's failure is: ``SandboxError`` (the ``kind`` and message a caller sees)
and the exceptions the guard and the child raise before classifying them
(``search.adapters.sandbox.child.classify``)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ERROR_KINDS", "TRACEBACK_LINES", "CpuTimeExceeded", "Failure", "Forbidden",
           "SandboxError"]

#: What a failed run's ``SandboxError.kind`` may be.
ERROR_KINDS = ("forbidden_import", "timeout", "memory", "crash", "invalid_policy", "settings")
#: Traceback lines kept in a crash message.
TRACEBACK_LINES = 14


class SandboxError(NamedTuple):
    """Why a run failed: ``kind`` (one of ``ERROR_KINDS``) and a message for the program's
    author (a crash's message ends with the traceback's tail)."""

    kind: str
    message: str


class Forbidden(BaseException):
    """The program used something outside the allowlist. A ``BaseException``, so neither the
    program's nor the engine's ``except Exception`` turns it into something else."""


class CpuTimeExceeded(BaseException):
    """SIGXCPU: the CPU-time limit passed (a ``BaseException`` for the same reason)."""


class Failure(Exception):
    """A failure the child has already classified."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

