"""How JUMP's microscopes name their images, as the release stores them (the twin writes these).

Read from the jump-cellpainting ``datasets`` repository (``metadata/microscope_config.csv``,
``channel_mapping.csv``) and the release's keys:

- Opera Phenix (sources 1, 3, 4, 9, 11, 15): a folder ``<plate>__<date>-Measurement1`` (source
  3 writes ``Measurement 1``, with a space) holding
  ``Images/r<row>c<col>f<site>p01-ch<k>sk1fk1fl1.tiff``;
- CV8000 / CV7000 (sources 2, 5, 6, 7, 10, 13):
  ``<folder>/<folder>_<well>_T0001F<site>L01A<k>Z01C<k>.tif`` in a folder not always named like
  the plate (source 5: ``P01_<plate>``), with no ``Images/``
  level (cpgdata 0.6.0's key grammar rejects these keys, the release's own as well);
- ImageXpress (source 8): ``Images/HTS_<well>_s<site>_w<k><UUID>.tif`` (not written by the twin).

The channel number ``k`` of each stain differs per source (``channel_mapping.csv``); the
load-data table says which file is which channel, so build-cache never parses these names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Microscope:
    """One source's instrument and its file naming."""

    source: str
    name: str  # Metadata_Microscope_Name
    batch: str
    channel_number: dict[str, int]  # channel_mapping.csv: stain -> the file's channel number
    sites_per_well: int
    pixel_size_um: float
    measurement: str = "Measurement1"  # Phenix folder suffix

    def folder(self, plate: str, index: int) -> str:
        """The plate's image folder under ``images/<batch>/images/``."""
        if self.name == "Opera Phenix":
            return f"{plate}__2021-05-{2 + index:02d}T16_02_51-{self.measurement}/Images"
        return f"P{index + 1:02d}_{plate}"

    def file_name(self, folder: str, row: int, col: int, site: int, channel: str) -> str:
        """The image of one site and stain (``row``/``col`` 1-based)."""
        k = self.channel_number[channel]
        if self.name == "Opera Phenix":
            return f"r{row:02d}c{col:02d}f{site:02d}p01-ch{k}sk1fk1fl1.tiff"
        well = f"{'ABCDEFGHIJKLMNOP'[row - 1]}{col:02d}"
        return f"{folder}_{well}_T0001F{site:03d}L01A{k:02d}Z01C{k:02d}.tif"


PHENIX_CHANNELS = {"DNA": 5, "ER": 4, "RNA": 3, "AGP": 2, "Mito": 1}  # sources 3 and 4
CV8000_CHANNELS = {"DNA": 1, "ER": 2, "RNA": 3, "AGP": 4, "Mito": 5}  # sources 2, 5, 6, 10

# The twin's sources, in the order plates are dealt to them.
TWIN_MICROSCOPES = (
    Microscope("source_4", "Opera Phenix", "2021_04_26_Batch1", PHENIX_CHANNELS, 9, 0.597976),
    Microscope("source_2", "CV8000", "20210607_Batch_2", CV8000_CHANNELS, 6, 0.65),
    Microscope("source_3", "Opera Phenix", "CP59", PHENIX_CHANNELS, 9, 0.597976, "Measurement 1"),
)
