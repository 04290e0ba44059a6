"""The octtrain exception hierarchy: every error the trainer raises on purpose is one of these.

The CLI turns an ``OcttrainError`` into a one-line message and a non-zero exit code; anything
else is a bug and keeps its traceback.
"""

WORKER_PREFIX = "Caught "  # torch's DataLoader: "Caught DataError in DataLoader worker process 0."


class OcttrainError(Exception):
    """Base class for every deliberate octtrain failure.

    A DataLoader worker's exception reaches the main process rebuilt by torch as
    ``type(exc)("Caught X in DataLoader worker process N.\nOriginal Traceback ...")``; the
    constructor takes the original one-line message back out of that text, so the error the
    user sees is the worker's message and never a traceback.
    """

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (_from_worker(args[0], type(self)),)
        super().__init__(*args)


def _from_worker(message: str, cls: type) -> str:
    if not message.startswith(WORKER_PREFIX) or "\nOriginal Traceback" not in message:
        return message
    marker = f"\n{cls.__module__}.{cls.__qualname__}: "
    _, found, original = message.rpartition(marker)
    return original.strip() if found else message


class ConfigError(OcttrainError, ValueError):
    """A config value or key is invalid; the message names the dotted key."""


class DataError(OcttrainError):
    """The manifest or the cache cannot feed this run (schema, cache version, shapes, splits,
    a volume missing, short or corrupt in the cache); the message names the volume or file."""


class BackendError(OcttrainError):
    """The requested device backend is unavailable or misconfigured."""


class PeerLostError(BackendError):
    """Another process of a multi-process run ended (a closed connection) or stopped answering
    (a collective's timeout); the message names its address. This process stops (exit 6)."""


class CheckpointError(OcttrainError):
    """A checkpoint cannot be written, found or read."""


class NonFiniteLossError(OcttrainError):
    """The loss or the gradient norm became NaN or infinite; the run stops, checkpoints stay."""
