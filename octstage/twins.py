"""The folder ``octstage synth`` writes a twin into (the AI-READI twin or the Cell Painting one).

A twin is written only into a new or empty folder, or over a twin of its own kind that synth
wrote (its marker file names the kind and the parameters). The same parameters again write the
same bytes: allowed, and said. Other parameters would replace every file of the twin that is
there: refused unless ``--overwrite``, naming both. A folder synth did not write, or a twin of
the other kind, is always refused, untouched. What replacing removes is only the twin's own
trees, which its marker's parameters write again byte for byte (same seed, same bytes), so
nothing is lost that cannot be had again; the rest of the folder's rule is ``outputs.py``'s
(``check_output_folder``: a folder that can be made and written into).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from octstage.errors import ConfigError
from octstage.outputs import check_output_folder

MARKER = ".octstage-synth"  # marks a folder synth made; its first word names the kind
console = Console(stderr=True)


def _kind_of(marker: str) -> str:
    """The kind a marker names; the first markers (OCT only) named none."""
    first = marker.split(maxsplit=1)[0] if marker.strip() else ""
    return first.removeprefix("kind=") if first.startswith("kind=") else "oct"


def claim_twin(
    out: Path, marker: str, overwrite: bool, clear: Callable[[], None], flag: str = ""
) -> None:
    """Make ``out`` ready for the twin whose marker text is ``marker`` (``kind=<kind> ...``):
    refused as the module doc says; over an earlier twin of this kind ``clear`` removes its
    trees first. ``flag``: how the command names the kind (``--kind cellpainting``)."""
    kind = _kind_of(marker)
    mark = out / MARKER
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder; name a folder for the twin")
    if out.exists() and any(out.iterdir()):
        old = mark.read_text(encoding="utf-8") if mark.is_file() else None
        if old is None or _kind_of(old) != kind:
            raise ConfigError(
                f"{out}: exists, is not empty and was not made by octstage synth"
                f"{' ' + flag if flag else ''}; name an empty or new folder"
            )
        if old != marker and not overwrite:
            raise ConfigError(
                f"{out}: holds another twin ({old.strip()}); this run would replace every file "
                f"of it with the twin of {marker.strip()}: pass --overwrite to replace it (the "
                "parameters above write the old one again, byte for byte), or name another "
                "folder"
            )
        said = "replacing" if old != marker else "writing again (same parameters, same bytes)"
        console.print(f"octstage synth: {out}: {said} the twin there ({old.strip()})", markup=False)
        clear()
    check_output_folder(out, ConfigError, "OUT")
    mark.write_text(marker, encoding="utf-8")
