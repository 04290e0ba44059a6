"""The octstage exception hierarchy: every error the package raises on purpose is one of these."""


class OctstageError(Exception):
    """Base class for every deliberate octstage failure; the CLI exits with ``exit_code``."""

    exit_code = 2


class MachineError(OctstageError):
    """The machine failed, not the input (the disk or a quota is full): the message names the
    path, and the same command may pass once that is mended. build-cache exits 3 for it."""

    exit_code = 3


class ConfigError(OctstageError, ValueError):
    """A setting is invalid (raised when a config dataclass is built)."""


class DicomError(OctstageError):
    """A DICOM file cannot be read or decoded; the message names the file and the reason."""


class IdError(OctstageError):
    """A participant ID cannot be verified for a file."""


class LabelsError(OctstageError):
    """participants.tsv is missing, malformed or inconsistent."""


class ManifestError(OctstageError):
    """A manifest is missing, malformed, of another schema or cache version."""


class ManifestTypeError(ManifestError):
    """A manifest's values are not of its schema's types, or keys of its items are missing,
    unknown or given twice (``manifest.itemtypes``): it does not load. ``problems``: one line
    each, naming the item, the key, the value and what was expected."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class StorageError(OctstageError):
    """A storage backend failed (missing object, refused name, remote error)."""


class ObjectNotFoundError(StorageError):
    """The object does not exist (as opposed to a backend that failed to say)."""


class UnsafePathError(StorageError):
    """An object name would escape its destination folder (``..``, absolute path)."""


class MirrorError(OctstageError):
    """A mirror or stage run was refused or failed (empty source, too many deletions...)."""


class VerificationError(OctstageError):
    """Stored bytes do not match their recorded checksum."""


class DicomEnvironmentError(DicomError):
    """A file could not be read or decoded because of this machine, not because of its bytes
    (no decoder plugin for its transfer syntax, an I/O error on a network disk): a later run may
    succeed, so this verdict is reported but never remembered."""


class ReleaseError(OctstageError):
    """A table of the release (retinal_oct/manifest.tsv, a clinical_data/ OMOP table) is
    malformed, or asks for something it does not hold (an unknown concept id)."""


class CellPaintingError(OctstageError):
    """A Cell Painting load-data or perturbation table is malformed, or a field cannot be
    staged for a reason of its data (the message names the table, row or file)."""
