"""The octtrain exception hierarchy: every error the trainer raises on purpose is one of these.

The CLI turns an ``OcttrainError`` into a one-line message and a non-zero exit code; anything
else is a bug and keeps its traceback.
"""


class OcttrainError(Exception):
    """Base class for every deliberate octtrain failure."""


class ConfigError(OcttrainError, ValueError):
    """A config value or key is invalid; the message names the dotted key."""


class DataError(OcttrainError):
    """The manifest or the cache cannot feed this run (schema, cache version, shapes, splits)."""


class BackendError(OcttrainError):
    """The requested device backend is unavailable or misconfigured."""


class CheckpointError(OcttrainError):
    """A checkpoint cannot be written, found or read."""


class NonFiniteLossError(OcttrainError):
    """The loss or the gradient norm became NaN or infinite; the run stops, checkpoints stay."""
