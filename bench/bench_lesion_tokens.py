"""Do an encoder's frozen tokens carry the lesion twin's lesions? A token-level linear probe.

The lesion twin's class is the number of small 3D lesions (``synth_lesions.py``); to count them a
head needs tokens that say "a lesion is here". V-JEPA learns what the predictor can predict from
the context, and a lesion the mask hides is not predictable: an encoder can pretrain well and
carry little of them (issue 26). This measures it directly, in about a minute, instead of through
15-minute fine-tuning runs: volumes rendered as the four devices of ``bench_label_efficiency.py``
show them (``render_with_mask``: the same look, noise and depth shift), each token labelled by
whether ``--min-voxels`` voxels of a lesion fall in its patch, a logistic regression on the
frozen tokens of 70% of the volumes, its AUROC on the other 30% (a 95% bootstrap interval over
those volumes). Each checkpoint is scored beside a random init of the same architecture (the
first checkpoint's; its input statistics copied), in the same run.

Calibration (``bench/results/lesion-tokens.log``, the defaults): the encoder of a fine-tuning
run from random init at 100% of the labels (test balanced accuracy 0.73) scores 0.933, a random
init 0.740, V-JEPA after 3000 steps 0.767, after 30,000 0.873, after 30,000 with the
acquisition looks and ``two_looks`` 0.925.

    python bench/bench_lesion_tokens.py CHECKPOINT [CHECKPOINT ...] [--encoder target]
        [--volumes 400] [--seed 0] [--labels NAME,NAME,...] [--json FILE]

A pretraining or fine-tuning checkpoint (its encoder) of the benchmark's shape (16x32x32), or
a run's checkpoint folder (its latest).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler
from torch import nn

from octstage.dataset.synth_lesions import NUM_CLASSES
from octtrain.config.loader import from_dict
from octtrain.config.sections import ModelConfig
from octtrain.embed.encoders import load_encoder
from octtrain.errors import OcttrainError
from octtrain.eval.common.bootstrap import bootstrap
from octtrain.models.classifier import resolve_model
from octtrain.models.inputs import legacy_model
from octtrain.models.vit3d import encoder_from_config
from octtrain.runtime.checkpoint import load_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the twin's device looks
from device_looks import DEVICE_LOOK, render_with_mask

SHAPE = (16, 32, 32)
TRAIN_SHARE = 0.7


@dataclass(frozen=True)
class Score:
    name: str
    auroc: float
    low: float
    high: float


def lesion_volumes(n: int, seed: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """``n`` volumes ``[n, D, H, W]`` and their lesion masks: labels cycle 0..3, looks cycle
    through the four devices (offset, so every device shows every class)."""
    looks = list(DEVICE_LOOK.values())
    rng = np.random.default_rng([seed, 27])
    pairs = [
        render_with_mask(SHAPE, i % NUM_CLASSES, looks[(i // NUM_CLASSES) % len(looks)], rng)
        for i in range(n)
    ]
    return np.stack([v for v, _ in pairs]), np.stack([m for _, m in pairs])


def token_targets(
    masks: npt.NDArray[np.bool_], patch: tuple[int, int, int], min_voxels: int
) -> npt.NDArray[np.int64]:
    """``[n, tokens]``: 1 where at least ``min_voxels`` lesion voxels fall in the token's patch
    (tokens in the encoder's order: depth, rows, columns)."""
    n, (d, h, w), (pd, ph, pw) = len(masks), masks.shape[1:], patch
    counts = masks.reshape(n, d // pd, pd, h // ph, ph, w // pw, pw).sum(axis=(2, 4, 6))
    return (counts.reshape(n, -1) >= min_voxels).astype(np.int64)


@torch.no_grad()
def frozen_tokens(encoder: nn.Module, volumes: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """``[n, tokens, dim]``: the encoder's tokens of the volumes as the trainer feeds them
    ([-1, 1]; the encoder standardises them itself)."""
    encoder.eval()
    x = torch.from_numpy(volumes)[:, None].float() * (2.0 / 255.0) - 1.0
    out = [encoder(x[i : i + 50]) for i in range(0, len(x), 50)]
    return torch.cat(out).float().numpy()


def token_auroc(
    tokens: npt.NDArray[np.float32], targets: npt.NDArray[np.int64], seed: int, resamples: int
) -> tuple[float, float, float]:
    """(AUROC, low, high) of a logistic regression fitted on the first ``TRAIN_SHARE`` of the
    volumes' tokens, scored on the rest; the interval resamples the held-out volumes whole
    (``octtrain.eval.common.bootstrap``, a volume's tokens as one cluster)."""
    cut = int(len(tokens) * TRAIN_SHARE)
    dim = tokens.shape[-1]
    scaler = StandardScaler().fit(tokens[:cut].reshape(-1, dim))
    probe = LogisticRegression(max_iter=2000, C=0.1)
    probe.fit(scaler.transform(tokens[:cut].reshape(-1, dim)), targets[:cut].ravel())
    held = tokens[cut:].reshape(-1, dim)
    scores = probe.decision_function(scaler.transform(held))
    truth = targets[cut:].ravel()
    volume_of = [str(v) for v in np.repeat(np.arange(len(tokens) - cut), targets.shape[1])]

    def auroc(idx: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        t = truth[idx]
        defined = 0 < t.sum() < len(t)  # a draw of lesion-free volumes has no AUROC
        return np.array([roc_auc_score(t, scores[idx]) if defined else np.nan])

    (interval,) = bootstrap(auroc, volume_of, len(truth), resamples, seed)
    return interval.value, interval.low, interval.high


def encoders(
    paths: list[Path], which: str, labels: list[str] | None = None
) -> list[tuple[str, nn.Module, tuple[int, int, int]]]:
    """(name, encoder, patch) per checkpoint (named by ``labels``, else its path), then a random
    init of the first pretraining checkpoint's architecture with its input statistics."""
    out, first = [], None
    for i, path in enumerate(paths):
        try:
            state = load_checkpoint(str(path))
            encoder, shape, _, _ = load_encoder(state, str(path), which)
        except OcttrainError as exc:
            raise SystemExit(f"error: {exc}") from None
        if tuple(shape) != SHAPE:
            raise SystemExit(f"{path}: input shape {shape}, the twin's is {SHAPE}")
        name = labels[i] if labels else str(path)
        out.append((name, encoder, tuple(encoder.patch_embed.kernel_size)))
        if first is None and state.get("kind") != "finetune":
            first = (state, path, encoder)
    if first is None:
        raise SystemExit("no pretraining checkpoint among them: the random init copies one's")
    state, path, trained = first
    saved = from_dict(ModelConfig, legacy_model(state["config"]["model"]))
    torch.manual_seed(0)
    rand = encoder_from_config(resolve_model(saved, state["config"]["model"], str(path)))
    # Random init sees its input as the pretrained encoder does (the same input statistics).
    rand.input_norm.load_state_dict(trained.input_norm.state_dict())
    out.append(("random init", rand, tuple(rand.patch_embed.kernel_size)))
    return out


def lesion_token_scores(
    paths: list[Path],
    which: str = "target",
    volumes: int = 400,
    seed: int = 0,
    resamples: int = 1000,
    min_voxels: int = 15,
    labels: list[str] | None = None,
    say: bool = False,
) -> tuple[list[Score], float]:
    """Each checkpoint's token lesion AUROC (named by ``labels``, else its path), then a random
    init's (``encoders``); and the share of tokens that hold a lesion."""
    arrays, masks = lesion_volumes(volumes, seed)
    scores, share = [], 0.0
    for name, encoder, patch in encoders(paths, which, labels):
        targets = token_targets(masks, patch, min_voxels)
        share = float(targets.mean())
        auroc, low, high = token_auroc(frozen_tokens(encoder, arrays), targets, seed, resamples)
        scores.append(Score(name, auroc, low, high))
        if say:
            print(f"{auroc:.3f} [{low:.3f}, {high:.3f}]  {name}", flush=True)
    return scores, share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path, nargs="+")
    parser.add_argument("--encoder", choices=("target", "context"), default="target")
    parser.add_argument("--volumes", type=int, default=400, help="rendered volumes (70%% fit)")
    parser.add_argument("--min-voxels", type=int, default=15, help="lesion voxels of a positive")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rendered volumes")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples of the interval")
    parser.add_argument(
        "--labels",
        type=lambda text: text.split(","),
        default=None,
        help="comma-separated names of the checkpoints in the table and the JSON (default: "
        "their paths)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the scores here too")
    args = parser.parse_args()
    if args.labels is not None and len(args.labels) != len(args.checkpoints):
        parser.error(f"--labels names {len(args.labels)} encoders for {len(args.checkpoints)}")
    torch.set_num_threads(1)  # 2 shared cores
    scores, share = lesion_token_scores(
        args.checkpoints, args.encoder, args.volumes, args.seed, args.bootstrap,
        args.min_voxels, args.labels, say=True,
    )  # fmt: skip
    print(
        f"\n{args.volumes} volumes, {share:.1%} of tokens hold a lesion; token "
        f"lesion AUROC of a linear probe on frozen {args.encoder} tokens [95% interval]:"
    )
    print("| encoder | token lesion AUROC |\n| --- | --- |")
    for s in scores:
        print(f"| {s.name} | {s.auroc:.3f} [{s.low:.3f}, {s.high:.3f}] |")
    if args.json:
        settings = {k: getattr(args, k) for k in ("encoder", "volumes", "min_voxels", "seed")}
        settings["resamples"] = args.bootstrap
        doc = {"settings": settings, "share_of_lesion_tokens": share,
               "scores": [s.__dict__ for s in scores]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
