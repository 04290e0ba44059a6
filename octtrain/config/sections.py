"""The config sections pretraining and finetuning share: model, data, train, validation, logging,
checkpoint. One frozen dataclass each, validated when built.

A run counts in one unit: optimizer steps for pretraining (``train.max_steps``), epochs of the
training split for finetuning (``train.epochs``). ``validation.every`` and ``checkpoint.every``
count in that unit. The job configs (``config/pretrain.py``, ``config/finetune.py``) compose these
sections with their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from octtrain.errors import ConfigError

WANDB_MODES = ("online", "offline", "disabled")
DEVICES = ("auto", "cpu", "cuda", "xla")
PRECISIONS = ("auto", "bf16", "fp32")
# The ViTs' input rule and positions (models/inputs.py); LEGACY is what a model config written
# before these options meant (the [-1, 1] input, fixed sin-cos at full scale).
INPUT_NORMS = ("dataset", "sample", "none")
POS_EMBEDS = ("learned", "sincos")
LEGACY_INPUTS: dict[str, str] = {"input_norm": "none", "pos_embed": "sincos"}
ATTENTIONS = ("auto", "sdpa", "blocked", "flash", "math")


def check(ok: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``ok``."""
    if not ok:
        raise ConfigError(message)


def _positive(name: str, values: tuple[int, ...], n: int = 3) -> None:
    check(len(values) == n and all(v > 0 for v in values), f"{name} must be {n} positive ints")


def none_if_blank(value: str | None) -> str | None:
    """None for YAML null and for the strings careless overrides produce ("", "None", "null"):
    such a value must never become a folder or a bucket named "None"."""
    if value is None or value.strip() in ("", "None", "none", "null"):
        return None
    return value


@dataclass(frozen=True)
class Preset:
    """Encoder and predictor sizes."""

    embed_dim: int
    depth: int
    num_heads: int
    pred_dim: int
    pred_depth: int
    pred_heads: int


PRESETS: dict[str, Preset] = {
    # Unit tests and the demo: thousands of parameters, a step in milliseconds on a CPU core.
    "tiny": Preset(embed_dim=48, depth=2, num_heads=3, pred_dim=24, pred_depth=1, pred_heads=2),
    # A small model that still learns something on 2 CPU cores in a minute or two.
    "small": Preset(embed_dim=96, depth=4, num_heads=4, pred_dim=48, pred_depth=2, pred_heads=4),
    # The sizes the users trained: ~29M and ~90M encoder parameters.
    "vit29m": Preset(embed_dim=512, depth=9, num_heads=8, pred_dim=256, pred_depth=6, pred_heads=8),
    "vit90m": Preset(
        embed_dim=768, depth=12, num_heads=12, pred_dim=384, pred_depth=12, pred_heads=12
    ),
}


@dataclass(frozen=True)
class ModelConfig:
    """The 3D ViT encoder and predictor: a named preset, optionally with some sizes overridden.

    ``input_shape`` (D, H, W) is what the model sees after cropping; None means the cache's
    volume shape, resolved from the manifest when the run starts. ``attention`` picks the kernel
    (``auto``: the best the backend has, see models/attention.py); ``activation_checkpointing``
    recomputes each block's activations in the backward pass instead of keeping them.
    """

    preset: str = "tiny"
    input_shape: tuple[int, int, int] | None = None
    patch: tuple[int, int, int] = (4, 16, 16)
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    pred_dim: int | None = None
    pred_depth: int | None = None
    pred_heads: int | None = None
    mlp_ratio: float = 4.0
    drop_path: float = 0.0
    attention: str = "auto"
    attention_block: int = 1024  # query rows per block for the blocked attention
    activation_checkpointing: bool = False
    # The encoder's first op (models/inputs.py, docs/learning-inputs.md): "dataset" standardises
    # with the train split's mean/std from the manifest, "sample" each volume by its own (the
    # per-volume rule: a device's gain and offset go), "none" the legacy [-1, 1] input.
    input_norm: str = "dataset"
    pos_embed: str = "learned"  # "learned" (std 0.02) or "sincos" (legacy fixed table)

    def __post_init__(self) -> None:
        check(self.preset in PRESETS, f"preset {self.preset!r} unknown (known: {list(PRESETS)})")
        _positive("patch", self.patch)
        if self.input_shape is not None:
            _positive("input_shape", self.input_shape)
            bad = [s % p for s, p in zip(self.input_shape, self.patch, strict=True)]
            check(
                not any(bad),
                f"input_shape {list(self.input_shape)} is not divisible by patch "
                f"{list(self.patch)}; choose a crop or patch size that divides it",
            )
        for name in ("embed_dim", "depth", "num_heads", "pred_dim", "pred_depth", "pred_heads"):
            value = getattr(self, name)
            check(value is None or value > 0, f"{name} must be positive or null, got {value}")
        check(self.mlp_ratio > 0, "mlp_ratio must be positive")
        check(0.0 <= self.drop_path < 1.0, "drop_path must be in [0, 1)")
        check(self.attention in ATTENTIONS, f"attention must be one of {ATTENTIONS}")
        check(self.attention_block > 0, "attention_block must be positive")
        check(self.input_norm in INPUT_NORMS, f"input_norm must be one of {INPUT_NORMS}")
        check(self.pos_embed in POS_EMBEDS, f"pos_embed must be one of {POS_EMBEDS}")

    def sizes(self) -> Preset:
        """The preset with any explicitly set sizes replacing the preset's."""
        base = PRESETS[self.preset]
        fields = Preset.__dataclass_fields__
        given = {k: getattr(self, k) for k in fields if getattr(self, k) is not None}
        return Preset(**{k: given.get(k, getattr(base, k)) for k in fields})


@dataclass(frozen=True)
class AugmentConfig:
    """Cheap, per-sample augmentations (train split only): crops and flips in the loader
    workers on uint8, brightness/contrast on the device where the volume becomes float."""

    random_crop: bool = True  # random crop of input_shape from the volume; centre crop if False
    flip_w: float = 0.5  # probability of a left-right flip (laterality mirror)
    flip_d: float = 0.0  # probability of reversing the B-scan order
    brightness: float = 0.1  # additive shift, uniform in [-b, b] (image range is [-1, 1])
    contrast: float = 0.1  # multiplicative factor, uniform in [1 - c, 1 + c]

    def __post_init__(self) -> None:
        for name in ("flip_w", "flip_d"):
            check(0.0 <= getattr(self, name) <= 1.0, f"{name} must be a probability")
        check(self.brightness >= 0 and 0 <= self.contrast < 1, "brightness/contrast out of range")


EYES = ("L", "R")
LABEL_TASKS = ("classification", "regression")


@dataclass(frozen=True)
class SelectConfig:
    """Which volumes of the manifest a run uses (empty: all). Each list keeps a volume whose
    value is one of its entries: ``device`` by folder (``topcon_triton``) or model (``Triton``),
    ``region`` by anatomic region (``Macula``: every macula scan, any scan size; or the release's
    full spelling ``Macula, 6 x 6``), ``scan_size`` (``6 x 6``), ``eye`` (``L`` / ``R``). A value
    no volume of the manifest has is an error (data/select.py), not an empty run."""

    device: tuple[str, ...] = ()
    region: tuple[str, ...] = ()
    scan_size: tuple[str, ...] = ()
    eye: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(all(e in EYES for e in self.eye), f"eye entries must be in {EYES}, got {self.eye}")


@dataclass(frozen=True)
class LabelConfig:
    """What a volume is trained to predict: ``concept: null`` is the study group (the manifest's
    classes); an OMOP concept id that build-cache copied (``--concept``) is its clinical value,
    as ``classification`` into the named bins (``bins``: ascending edges, ``names``: one more
    than the edges; a value equal to an edge goes to the upper bin) or as ``regression``. A
    volume without a usable value for the concept is left out and counted."""

    concept: int | None = None
    task: str = "classification"
    bins: tuple[float, ...] = ()
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(self.task in LABEL_TASKS, f"task must be one of {LABEL_TASKS}, got {self.task!r}")
        binned = self.concept is not None and self.task == "classification"
        check(
            binned == bool(self.bins),
            "bins are needed exactly for a clinical concept as classification",
        )
        check(list(self.bins) == sorted(set(self.bins)), "bins must be strictly ascending")
        check(
            len(self.names) == (len(self.bins) + 1 if self.bins else 0),
            "names: one per bin (len(bins) + 1), and none without bins",
        )
        check(
            self.concept is not None or self.task == "classification",
            "task regression needs a concept (the study group is a classification)",
        )

    @property
    def regression(self) -> bool:
        return self.task == "regression"


@dataclass(frozen=True)
class DataConfig:
    """Where the volumes come from and how they are loaded (batch_size is global)."""

    manifest: str | None = None
    cache: str | None = None  # cache root; None means the manifest's folder
    train_split: str = "train"
    val_split: str = "val"
    batch_size: int = 8
    num_workers: int = 2
    prefetch_factor: int = 2
    persistent_workers: bool = True
    pin_memory: bool = False
    max_samples: int | None = None  # use only the first N volumes of each split (fast start)
    balanced_sampling: bool = False  # finetuning: draw with equal class probability
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    label: LabelConfig = field(default_factory=LabelConfig)

    def __post_init__(self) -> None:
        check(self.batch_size > 0, "batch_size must be positive")
        check(self.num_workers >= 0, "num_workers must be >= 0")
        check(self.prefetch_factor > 0, "prefetch_factor must be positive")
        check(self.max_samples is None or self.max_samples > 0, "max_samples must be positive")


@dataclass(frozen=True)
class TrainConfig:
    """The loop: its length (steps or epochs), device, precision, watchdog and run folder."""

    max_steps: int | None = None  # pretraining: optimizer steps
    epochs: int | None = None  # finetuning: passes over the training split
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # auto: bf16 autocast on CUDA (when supported) and TPU, else fp32
    stall_timeout_s: float = 300.0  # watchdog: report when no step finished for this long
    # Added to the watchdog's limits until this process's first step finished: the first XLA
    # compile of a TPU step can take many minutes and is not a stall.
    first_step_allowance_s: float = 0.0
    # The backstop when a host hangs in a collective: after this long without a step (plus the
    # allowance before the first), report and end the process with exit code 5. 0: never.
    stall_exit_s: float = 0.0
    # XLA only: torch_xla's persistent compilation cache on local disk, so a restart reuses the
    # compiled step instead of compiling again. auto: ~/.cache/octtrain/xla on a TPU
    # (PJRT_DEVICE=TPU), none elsewhere; null or "" disables it.
    xla_cache_dir: str | None = "auto"
    cpu_threads: int = 0  # torch intra-op threads on CPU; 0: the cores left after data workers
    output_dir: str = "runs"
    name: str | None = None  # None: the job's name (pretrain, finetune)
    run_dir: str | None = None  # exact run folder; None means <output_dir>/<name>-<timestamp>
    overwrite: bool = False  # a run_dir holding a run: move it aside and start anew (not resume)

    def __post_init__(self) -> None:
        check(self.max_steps is None or self.max_steps > 0, "max_steps must be positive")
        check(self.epochs is None or self.epochs > 0, "epochs must be positive")
        check(self.device in DEVICES, f"device must be one of {DEVICES}, got {self.device!r}")
        check(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}")
        check(self.stall_timeout_s > 0, "stall_timeout_s must be positive")
        check(self.first_step_allowance_s >= 0, "first_step_allowance_s must be >= 0")
        check(
            self.stall_exit_s == 0 or self.stall_exit_s >= self.stall_timeout_s,
            "stall_exit_s must be 0 (never) or at least stall_timeout_s",
        )
        object.__setattr__(self, "xla_cache_dir", none_if_blank(self.xla_cache_dir))
        check(self.cpu_threads >= 0, "cpu_threads must be >= 0")
        object.__setattr__(self, "run_dir", none_if_blank(self.run_dir))


@dataclass(frozen=True)
class ValidationConfig:
    """When to validate (in the run's unit) and the alarms that judge what validation sees."""

    every: int = 0  # 0: pretraining never validates, finetuning only after its last epoch
    batches: int | None = None  # cap on validation batches per process; None = whole split
    batch_size: int | None = None  # per process; None: the training batch per process
    continue_on_failure: bool = True  # a failing validation is logged and counted, not fatal
    collapse_max_share: float = 0.8  # finetuning: alarm when one class takes more than this
    collapse_min_rank: float = 1.5  # pretraining: alarm when feature effective rank falls below
    # Targets that carry no image (eval/common/collapse.py, docs/learning-inputs.md): DINO's teacher
    # per-crop entropy within this share of log K of its batch entropy; V-JEPA's target
    # features varying across samples by less than this share of their mean.
    blind_entropy_margin: float = 0.03
    blind_min_spread: float = 0.02
    participant_level: bool = True  # finetuning: also participant-averaged probabilities

    def __post_init__(self) -> None:
        check(self.every >= 0, "every must be >= 0")
        check(self.batches is None or self.batches > 0, "batches must be positive")
        check(self.batch_size is None or self.batch_size > 0, "batch_size must be positive")
        check(0.0 < self.collapse_max_share <= 1.0, "collapse_max_share must be in (0, 1]")
        check(self.collapse_min_rank >= 0, "collapse_min_rank must be >= 0")
        check(0.0 <= self.blind_entropy_margin < 1.0, "blind_entropy_margin must be in [0, 1)")
        check(self.blind_min_spread >= 0, "blind_min_spread must be >= 0")


@dataclass(frozen=True)
class LoggingConfig:
    """W&B (or nothing), the local JSON-lines log and the console, all fed the same metrics."""

    wandb_mode: str | None = None  # None: $WANDB_MODE, else "offline"
    wandb_project: str = "octtrain"
    wandb_entity: str | None = None
    wandb_group: str | None = None
    log_every: int = 10  # steps; the first step and the last are always logged
    image_every: int = 0  # steps between input/mask/representation images; 0 disables
    console: bool = True

    def __post_init__(self) -> None:
        check(
            self.wandb_mode is None or self.wandb_mode in WANDB_MODES,
            f"wandb_mode must be one of {WANDB_MODES} or null, got {self.wandb_mode!r}",
        )
        check(self.log_every > 0, "log_every must be positive")
        check(self.image_every >= 0, "image_every must be >= 0")

    def resolved_wandb_mode(self) -> str:
        """The config's mode, else $WANDB_MODE, else offline (records locally, syncs later)."""
        mode = self.wandb_mode or os.environ.get("WANDB_MODE") or "offline"
        check(mode in WANDB_MODES, f"WANDB_MODE must be one of {WANDB_MODES}, got {mode!r}")
        return mode


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to checkpoint (in the run's unit); ``dir`` None/empty means
    <run_dir>/checkpoints. The last step/epoch is always saved."""

    dir: str | None = None  # local folder or gs://bucket/prefix
    every: int = 500
    keep_last: int = 3
    keep_best: bool = True  # also keep the checkpoint with the best validation score
    resume: str | None = None  # None: fresh start; "auto": latest in dir if any; else a file URL

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", none_if_blank(self.dir))
        object.__setattr__(self, "resume", none_if_blank(self.resume))
        check(self.every > 0, "every must be positive")
        check(self.keep_last > 0, "keep_last must be positive")
        for key in ("dir", "resume"):  # no bucket name holds an "@": a key written in the URL
            url = getattr(self, key) or ""
            host, _, rest = url.partition("://")[2].partition("/")
            check(
                "://" not in url or "@" not in host,
                f"{key} {url.partition('://')[0]}://***@{host.rpartition('@')[2]}/{rest}: "
                "credentials written into the URL are refused; give them to gcsfs the usual way "
                "(GOOGLE_APPLICATION_CREDENTIALS) and name the URL without them",
            )
        if self.dir is not None and self.dir.startswith("gs://"):
            bucket = self.dir[len("gs://") :].split("/")[0]
            check(bucket not in ("", "None", "none", "null"), f"dir {self.dir!r} has no bucket")
