"""How JUMP's microscopes name their images, as the release stores them (the twin writes these).

Read from the jump-cellpainting ``datasets`` repository (``metadata/microscope_config.csv``,
``channel_mapping.csv``) and the release's keys (one per source, as the gallery lists them):

- Opera Phenix (sources 1, 3, 4, 9, 11, 15): a folder ``<plate>__<date>-Measurement1`` (source
  3 writes ``Measurement 1``, with a space) holding
  ``Images/r<row>c<col>f<site>p01-ch<k>sk1fk1fl1.tiff``;
- CV8000 / CV7000 (sources 2, 5, 6, 7, 10, 13):
  ``<folder>/<folder>_<well>_T0001F<site>L01A<a>Z01C<k>.tif`` in a folder not always named like
  the plate (source 5: ``P01_<plate>``), with no ``Images/`` level (cpgdata 0.6.0's key grammar
  rejects these keys, the release's own as well). ``A<a>`` is the acquisition action, which
  differs from the channel ``C<k>`` where one action takes two channels (source 10:
  ``A03Z01C04`` for AGP, ``A04Z01C06`` for brightfield; source 7: ``A02Z01C03``);
- ImageXpress Micro Confocal (source 8): ``<plate>/Images/HTS_<well>_s<site>_w<k><UUID>.tif``,
  the UUID upper case and run straight onto the channel number (``HTS_A01_s1_w33EFC51B3-...``).

The channel number ``k`` of each stain differs per source (``channel_mapping.csv``); the
load-data table says which file is which channel, so build-cache never parses these names.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

PHENIX, CV8000, IMAGEXPRESS = "Opera Phenix", "CV8000", "ImageXpress Micro Confocal"
# microscope_config.csv's columns, in its order.
CONFIG_COLUMNS = (
    "Metadata_Source",
    "Metadata_Microscope_Name",
    "Metadata_Widefield_vs_Confocal",
    "Metadata_Excitation_Type",
    "Metadata_Objective_NA",
    "Metadata_N_Brightfield_Planes_Min",
    "Metadata_N_Brightfield_Planes_Max",
    "Metadata_Distance_Between_Z_Microns",
    "Metadata_Sites_Per_Well",
    "Metadata_Filter_Configuration",
    "Metadata_Pixel_Size_Microns",
)


@dataclass(frozen=True)
class Microscope:
    """One source's instrument, its file naming and its row of ``microscope_config.csv``."""

    source: str
    name: str  # Metadata_Microscope_Name
    batch: str
    channel_number: dict[str, int]  # channel_mapping.csv: stain -> the file's channel number
    sites_per_well: int
    pixel_size_um: float
    # The release's values of the other columns, Widefield_vs_Confocal to Filter_Configuration
    # (less Sites_Per_Well), as written there ("" where it gives none).
    optics: tuple[str, str, str, str, str, str, str]
    measurement: str = "Measurement1"  # Phenix folder suffix
    action_number: dict[str, int] = field(default_factory=dict)  # CV8000: stain -> A<a>

    def folder(self, plate: str, index: int) -> str:
        """The plate's image folder under ``images/<batch>/images/``."""
        if self.name == PHENIX:
            return f"{plate}__2021-05-{2 + index:02d}T16_02_51-{self.measurement}/Images"
        if self.name == IMAGEXPRESS:
            return f"{plate}/Images"
        return plate

    def file_name(self, folder: str, row: int, col: int, site: int, channel: str) -> str:
        """The image of one site and stain (``row``/``col`` 1-based; ``folder`` without its
        ``/Images``)."""
        k = self.channel_number[channel]
        well = f"{'ABCDEFGHIJKLMNOP'[row - 1]}{col:02d}"
        if self.name == PHENIX:
            return f"r{row:02d}c{col:02d}f{site:02d}p01-ch{k}sk1fk1fl1.tiff"
        if self.name == IMAGEXPRESS:
            # A UUID per image, drawn from its place: same twin, same names.
            digest = hashlib.sha256(f"{folder}/{well}/{site}/{k}".encode()).digest()
            name = str(uuid.UUID(bytes=digest[:16], version=4)).upper()
            return f"HTS_{well}_s{site}_w{k}{name}.tif"
        a = self.action_number.get(channel, k)
        return f"{folder}_{well}_T0001F{site:03d}L01A{a:02d}Z01C{k:02d}.tif"

    def config_row(self) -> dict[str, object]:
        """This source's row of ``microscope_config.csv`` as the release writes it."""
        values = (self.source, self.name, *self.optics[:6], self.sites_per_well)
        return dict(zip(CONFIG_COLUMNS, (*values, self.optics[6], self.pixel_size_um), strict=True))


PHENIX_CHANNELS = {"DNA": 5, "ER": 4, "RNA": 3, "AGP": 2, "Mito": 1}  # sources 3, 4 and 8
CV8000_CHANNELS = {"DNA": 1, "ER": 2, "RNA": 3, "AGP": 4, "Mito": 5}  # sources 2, 5, 6, 10
# Source 10's actions: C01 and C02 in A01, C03 in A02, C04 (AGP, as the release names it) and
# C05 in A03 (C06, brightfield, is A04 there); source 7's keys group its channels alike.
CV8000_ACTIONS = {"DNA": 1, "ER": 1, "RNA": 2, "AGP": 3, "Mito": 3}

# The twin's sources, in the order plates are dealt to them: every microscope of the release.
TWIN_MICROSCOPES = (
    Microscope(
        "source_4", PHENIX, "2021_04_26_Batch1", PHENIX_CHANNELS, 9, 0.597976,
        ("Widefield", "Laser", "1.0", "3", "3", "5", "B"),
    ),
    Microscope(
        "source_10", CV8000, "2021_05_31_U2OS_48_hr_run1", CV8000_CHANNELS, 6, 0.6516944,
        ("Confocal", "Laser", "0.75", "3", "3", "5", "A"), action_number=CV8000_ACTIONS,
    ),
    Microscope(
        "source_3", PHENIX, "CP59", PHENIX_CHANNELS, 9, 0.597976,
        ("Widefield", "Laser", "1.0", "0", "3", "5", "B"), "Measurement 1",
    ),
    Microscope(
        "source_8", IMAGEXPRESS, "J1", PHENIX_CHANNELS, 9, 0.7032,
        ("Confocal", "LED", "0.75", "0", "0", "3", "E"),
    ),
)  # fmt: skip
