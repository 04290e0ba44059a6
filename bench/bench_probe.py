"""Does V-JEPA pretraining add anything? Frozen-encoder probes, random init vs pretrained.

On synthetic lesion volumes (octstage/dataset/synth_lesions.py: the class is the number, 0..3, of
small
bright or dark 3D blobs in a layered retina), for each seed:

1. write a real cache + manifest (train/val/test, balanced classes);
2. pretrain with the real trainer (``run_pretrain`` on configs/pretrain/tiny.yaml) and take the
   EMA target encoder of the last checkpoint (the last, not the trainer's best-by-k-NN, so no
   labels touch the pretrained encoder);
3. on frozen tokens of (a) a random-init encoder of the same architecture and (b) that target
   encoder, fit the same probes: a linear probe (logistic regression on standardised mean-pooled
   tokens, C chosen on val) and an attentive probe (octtrain's attentive head, trained alone,
   epoch chosen on val);
4. finetune a random-init encoder with labels (``run_finetune``, ``init_encoder=random``) as the
   supervised upper reference, best epoch by val balanced accuracy.

Every score is balanced accuracy on the held-out test split. Prints mean and std over seeds next
to chance (0.25), whether the target (pretrained minus random >= 0.10, averaged over seeds) is
reached, and where the wall time went. ``--quick``: one seed, small split, few steps.

    PYTHONPATH=$PWD python bench/bench_probe.py [--quick] [--seeds 3] [--steps 3000]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader

from octstage.dataset.ids import DEVICES
from octstage.dataset.labels import STUDY_GROUPS
from octstage.dataset.synth_lesions import NUM_CLASSES, render_lesions
from octtrain.config.finetune import FinetuneConfig, HeadConfig
from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.data.dataset import ManifestDataset, Transform, read_manifest, to_model_input
from octtrain.eval.common.metrics import balanced_accuracy, confusion_matrix
from octtrain.models.classifier import classifier_from_state, encoder_from_state
from octtrain.models.heads import ClassifierHead
from octtrain.models.vit3d import encoder_from_config
from octtrain.runtime.checkpoint import load_checkpoint
from octtrain.train.finetune import run_finetune
from octtrain.train.pretrain import run_pretrain

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.octtrain, from a checkout
from tests.octtrain.tiny_cache import cached_volume, write_synthetic_manifest

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "configs" / "pretrain" / "tiny.yaml"
FINETUNE = REPO / "configs" / "finetune" / "tiny.yaml"
CHANCE = 1.0 / NUM_CLASSES
TARGET_GAIN = 0.10
SPLITS = ("train", "val", "test")
QUIET = ["logging.wandb_mode=disabled", "logging.console=false", "data.num_workers=0"]


@dataclass(frozen=True)
class Budget:
    shape: tuple[int, int, int]
    patch: tuple[int, int, int]
    counts: dict[str, int]  # volumes per class and split
    pretrain_steps: int
    finetune_epochs: int
    probe_epochs: int


def budget(args: argparse.Namespace) -> Budget:
    if args.quick:
        counts = {"train": 16, "val": 6, "test": 8}
        return Budget((16, 32, 32), (4, 8, 8), counts, args.steps or 60, 4, 30)
    # ~4.5 min a seed on 2 busy cores; with 48 volumes a class and 20 epochs even the
    # supervised reference stayed near chance, so the full run spends its time on data and steps.
    counts = {"train": args.train or 256, "val": 12, "test": 24}
    return Budget((16, 32, 32), (4, 8, 8), counts, args.steps or 3000, args.epochs or 40, 60)


def write_lesion_cache(root: Path, b: Budget, seed: int) -> Path:
    """A real Zarr cache + manifest of lesion volumes (tests/octtrain/tiny_cache.py's recipe)."""
    cache = root / "cache"
    rng = np.random.default_rng([seed, 10])
    volumes = []
    pid = 1000
    for split, per_class in b.counts.items():
        for i in range(per_class):
            for label, group in enumerate(STUDY_GROUPS[:NUM_CLASSES]):
                pid += 1
                array = render_lesions(b.shape, label, rng)
                volumes.append(
                    cached_volume(
                        cache,
                        str(pid),
                        f"k{pid:05d}",
                        array,
                        split=split,
                        label=label,
                        group=group,
                        device=DEVICES[i % len(DEVICES)],
                        laterality="LR"[pid % 2],
                        protocol="synthetic-lesions",
                    )
                )
    classes = STUDY_GROUPS[:NUM_CLASSES]
    config = {"shape": list(b.shape), "seed": seed}
    path = write_synthetic_manifest(cache, volumes, classes, "bench-probe-lesions", config)
    return path


def model_overrides(b: Budget) -> list[str]:
    return [f"model.patch=[{','.join(map(str, b.patch))}]"]


def pretrain(manifest: Path, run_dir: Path, b: Budget, seed: int) -> str:
    """The last checkpoint of a real V-JEPA pretraining run."""
    overrides = [
        f"data.manifest={manifest}",
        f"train.run_dir={run_dir}",
        f"train.max_steps={b.pretrain_steps}",
        f"train.seed={seed}",
        f"schedule.warmup_steps={max(5, b.pretrain_steps // 20)}",
        f"checkpoint.every={b.pretrain_steps}",
        "train.cpu_threads=1",
        *model_overrides(b),
        *QUIET,
    ]
    result = run_pretrain(load_config(PretrainConfig, PRETRAIN, overrides))
    assert result.last_checkpoint is not None
    return result.last_checkpoint


def tokens_of(encoder: nn.Module, manifest: Path, split: str) -> tuple[torch.Tensor, np.ndarray]:
    """Frozen tokens (N, T, D) of a split (centre crop = the whole volume, no augmentation)."""
    m = read_manifest(str(manifest))
    data = ManifestDataset(m, manifest.parent, split, Transform(m.split(split)[0].shape, None))
    encoder.eval()
    chunks, labels = [], []
    with torch.no_grad():
        for batch in DataLoader(data, batch_size=16):
            chunks.append(encoder(to_model_input(batch)))
            labels.append(batch["label"].numpy())
    return torch.cat(chunks), np.concatenate(labels)


Features = dict[str, tuple[torch.Tensor, np.ndarray]]


def bacc(labels: np.ndarray, preds: np.ndarray) -> float:
    return balanced_accuracy(confusion_matrix(labels, preds, NUM_CLASSES))


def linear_probe(f: Features) -> float:
    """Logistic regression on standardised mean-pooled tokens; C picked on val, then test."""
    x = {s: f[s][0].mean(dim=1).numpy() for s in SPLITS}
    scaler = StandardScaler().fit(x["train"])
    x = {s: scaler.transform(v) for s, v in x.items()}
    best = (-1.0, 1.0)
    for c in (0.01, 0.1, 1.0, 10.0):
        clf = LogisticRegression(C=c, max_iter=2000).fit(x["train"], f["train"][1])
        best = max(best, (bacc(f["val"][1], clf.predict(x["val"])), c))
    clf = LogisticRegression(C=best[1], max_iter=2000).fit(x["train"], f["train"][1])
    return bacc(f["test"][1], clf.predict(x["test"]))


def attentive_probe(f: Features, epochs: int, seed: int) -> float:
    """octtrain's attentive head alone on frozen tokens; test score at the first epoch of the best
    val score (a tie on val is not broken by the test score, as a tuple max would)."""
    torch.manual_seed(seed)
    dim = f["train"][0].shape[-1]
    cfg = HeadConfig(kind="attentive", pooling="attentive", num_heads=3)
    head = ClassifierHead(cfg, dim, NUM_CLASSES, has_cls=False)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.05)
    x, y = f["train"][0], torch.from_numpy(f["train"][1])
    best = (-1.0, 0.0)
    for _ in range(epochs):
        head.train()
        for idx in torch.randperm(len(y)).split(16):
            loss = nn.functional.cross_entropy(head(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        head.eval()
        with torch.no_grad():
            scores = [bacc(f[s][1], head(f[s][0]).argmax(1).numpy()) for s in ("val", "test")]
        if scores[0] > best[0]:  # the first epoch of the best val score: test never chooses
            best = (scores[0], scores[1])
    return best[1]


def supervised(manifest: Path, run_dir: Path, b: Budget, seed: int) -> float:
    """Finetune a random-init encoder end to end; its best-val checkpoint scored on test."""
    overrides = [
        f"data.manifest={manifest}",
        f"train.run_dir={run_dir}",
        f"train.epochs={b.finetune_epochs}",
        f"train.seed={seed}",
        "train.cpu_threads=1",
        "init_encoder=random",
        "schedule.unfreeze_epoch=0",
        "optim.head_lr=1.0e-3",
        "data.batch_size=32",  # fewer, steadier steps: from scratch, batch 8 barely moved
        "optim.layer_decay=1.0",
        "early_stopping.patience=0",
        *model_overrides(b),
        *QUIET,
    ]
    result = run_finetune(load_config(FinetuneConfig, FINETUNE, overrides), None)
    assert result.best_checkpoint is not None
    model, _ = classifier_from_state(load_checkpoint(result.best_checkpoint))
    tokens, labels = tokens_of(model.encoder, manifest, "test")
    model.head.eval()
    with torch.no_grad():
        return bacc(labels, model.head(tokens).argmax(1).numpy())


def one_seed(
    root: Path, b: Budget, seed: int, cost: dict[str, float], probe_epochs: int
) -> dict[str, float]:
    """Every score of one seed; adds the seconds of each part to ``cost``."""
    t = time.perf_counter()

    def lap(part: str) -> None:
        nonlocal t
        now = time.perf_counter()
        cost[part] += now - t
        t = now

    manifest = write_lesion_cache(root / f"seed{seed}", b, seed)
    lap("data")
    ckpt = pretrain(manifest, root / f"seed{seed}" / "pretrain", b, seed)
    lap("pretrain")
    model_cfg = load_config(PretrainConfig, PRETRAIN, model_overrides(b)).model
    torch.manual_seed(seed)
    random_enc = encoder_from_config(dataclasses.replace(model_cfg, input_shape=b.shape))
    state = load_checkpoint(ckpt)
    target_enc, _, _ = encoder_from_state(state, ckpt, model_cfg, "target")
    # Random init sees its input as the pretrained encoder does (the same input statistics).
    random_enc.input_norm.load_state_dict(target_enc.input_norm.state_dict())
    scores = {}
    for name, enc in (("random", random_enc), ("pretrained", target_enc)):
        feats = {s: tokens_of(enc, manifest, s) for s in SPLITS}
        lap("features")
        scores[f"{name} linear"] = linear_probe(feats)
        scores[f"{name} attentive"] = attentive_probe(feats, probe_epochs, seed)
        lap("probes")
    scores["supervised (finetuned)"] = supervised(manifest, root / f"seed{seed}" / "ft", b, seed)
    lap("supervised")
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, small split, few steps")
    parser.add_argument("--seeds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="pretraining steps")
    parser.add_argument("--train", type=int, default=None, help="training volumes per class")
    parser.add_argument("--epochs", type=int, default=None, help="supervised epochs")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: temp)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # 2 shared cores: see configs/*/tiny.yaml
    b = budget(args)
    seeds = args.seeds or (1 if args.quick else 3)
    start = time.perf_counter()
    cost: dict[str, float] = defaultdict(float)
    rows: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        root = args.out or Path(tmp)
        for seed in range(seeds):
            for name, score in one_seed(root, b, seed, cost, b.probe_epochs).items():
                rows[name].append(score)
            print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in rows.items()))
    report(rows, b, seeds, cost, time.perf_counter() - start)


def report(
    rows: dict[str, list[float]], b: Budget, seeds: int, cost: dict[str, float], wall: float
) -> None:
    per_class = ", ".join(f"{s} {n}" for s, n in b.counts.items())
    print(
        f"\nlesion-count probe: volumes {b.shape}, patch {b.patch}, tiny ViT, {seeds} seed(s), "
        f"{per_class} per class; pretrain {b.pretrain_steps} steps, "
        f"supervised {b.finetune_epochs} epochs; balanced accuracy on test"
    )
    print(f"{'encoder / probe':<26} {'mean':>6} {'std':>6} {'chance':>7}  per seed")
    for name, values in rows.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        each = " ".join(f"{v:.3f}" for v in values)
        print(f"{name:<26} {statistics.mean(values):6.3f} {std:6.3f} {CHANCE:7.2f}  {each}")
    for probe in ("linear", "attentive"):
        pairs = zip(rows[f"pretrained {probe}"], rows[f"random {probe}"], strict=True)
        gains = [p - r for p, r in pairs]
        gain = statistics.mean(gains)
        verdict = "reached" if gain >= TARGET_GAIN else "NOT reached"
        print(f"pretrained - random, {probe} probe: {gain:+.3f} (target +{TARGET_GAIN}): {verdict}")
    parts = ", ".join(f"{k} {v:.0f}s" for k, v in cost.items())
    print(f"wall time {wall:.0f}s ({wall / 60:.1f} min): {parts}")


if __name__ == "__main__":
    main()
