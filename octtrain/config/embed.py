"""``octtrain embed``'s settings: one frozen dataclass, validated when built (the CLI's flags)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from octtrain.config.sections import check

EMBED_ENCODERS = ("auto", "teacher", "target", "context")
EMBED_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class EmbedConfig:
    """What to embed, with what, into where, and how the work is cut."""

    checkpoint: str  # a step_*.pt, or a run's checkpoint folder (its best, else its latest)
    manifest: str
    out: str
    cache: str | None = None  # the cache root; None: the manifest's folder
    split: str | None = None  # None: every item of the manifest
    encoder: str = "auto"  # DINO: its teacher; V-JEPA pretraining: target (EMA) or context
    device: str = "auto"
    batch_size: int = 8  # items per forward (a field's views all go in with it)
    # Loader processes reading and tiling ahead of the forward; None: 0 on CPU (the forward
    # takes every core: 1.5x faster on 2 cores than 1 thread beside 1 worker), else up to 8.
    num_workers: int | None = None
    part_size: int = 4096  # items per part: the unit of resuming and of sharding
    prefix: str = "emb_"  # feature columns: prefix + zero-padded index
    limit: int | None = None  # the first N items of the selection only (a trial)
    progress_s: float = 10.0  # seconds between progress lines

    def __post_init__(self) -> None:
        check(self.encoder in EMBED_ENCODERS, f"--encoder must be one of {EMBED_ENCODERS}")
        check(self.device in EMBED_DEVICES, f"--device must be one of {EMBED_DEVICES}")
        check(self.batch_size >= 1, f"--batch-size {self.batch_size}: must be at least 1")
        check(
            self.num_workers is None or self.num_workers >= 0,
            f"--num-workers {self.num_workers}: must be 0 or more",
        )
        check(self.part_size >= 1, f"--part-size {self.part_size}: must be at least 1")
        check(
            self.limit is None or self.limit >= 1,
            f"--limit {self.limit}: must be at least 1 (leave it out to embed every item)",
        )
        check(
            re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", self.prefix) is not None
            and not self.prefix.startswith("Metadata"),
            f"--prefix {self.prefix!r}: letters, digits and '_', starting with a letter and not "
            "with 'Metadata' (pycytominer and copairs tell features from metadata by it)",
        )
        check(self.progress_s > 0, "progress interval must be positive")
