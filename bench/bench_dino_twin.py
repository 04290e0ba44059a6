"""Would a Cell Painting team pick DINO's features over CellProfiler's? A CPU-sized check on the
twin, scored as JUMP scores profiles, on plates and compounds DINO never trained on, with
intervals.

For each twin seed of ``--twin-seeds`` it builds a Cell Painting cache: octstage's JUMP-layout
twin with its compound library and the learned family (``octstage synth --kind cellpainting
--plates 5 --compounds 30 --sites 2 --learned``, then ``octstage build-cache --kind
cellpainting``): 384-well plates, DMSO in 16 wells, one strong and four subtle named phenotypes,
30 library compounds (one or two features changed, from inside the nuisance to clear) and six
changes of arrangement at DMSO's amount (``families.LEARNED``) in 4 wells each, with the
twin's nuisance (per-well stain and density, per-field focus and background, per-plate gain
and residual illumination:
``octstage/cellpainting/cells.py``). DINO (the tiny 2D ViT, DINO + iBOT + KoLeo,
``configs/pretrain/dino-tiny.yaml``: crops standardised per channel, at native scale) trains for
``--steps`` on the first ``--train-plates`` plates only, without the wells of every
``--unseen-every``-th perturbation (held-out compounds). For each DINO seed of ``--seeds``,
``profile_fields`` then scores the held-out plates: DINO's teacher, the same encoder at random
init with 3 seeds, the handcrafted features and cp-measure's CellProfiler features (these two
computed once per twin), under JUMP's deep-learning recipe (no sphering) and the sphered one
(``eval/cellpainting/scores.py``), with copairs activity (against same-plate DMSO wells) and
distinctiveness mAP, 95% intervals resampling plates, control wells, perturbations and wells
(``eval/cellpainting/resample.py``), over every perturbation and over the held-out compounds, and
DINO minus each rival with a paired interval.

Beside each full embedding it scores its tokens alone, the restored statistics alone and a noise
floor (``profile_run.py``). It prints, per twin, DINO seed and recipe, the floor, the table, the
paired differences (DINO's and DINO's tokens'), the per-perturbation activity AP and a verdict
line (``docs/cellpainting-evaluation.md``, section 6): DINO's tokens above random init's tokens
(over every perturbation and the learned family), DINO above random
init, above the handcrafted set (paired activity interval above 0), within 0.05 of cp-measure,
and how many intensity-only and size-only perturbations DINO ranks above every random seed;
then whether each held over every run; and writes the reports to ``--json``. The recipe was
chosen on twin seed 7 with DINO seed 0; of the defaults, twin 12 and DINO seed 3 chose nothing,
twin 11 is the library an earlier round's per-compound APs were tuned against. Their run is in
``docs/benchmarks.md`` (log and JSON: ``bench/results/dino-twin-learned.*``). ``--work`` keeps
the twins and the runs: a second run with the same flags rescores the finished checkpoints
without training them again.

``--device cuda`` trains and embeds on a GPU (give the sizes a GPU run wants as overrides, with
``data.num_workers``).

    PYTHONPATH=$PWD python bench/bench_dino_twin.py [--steps 12000] [--seeds 3]
        [--twin-seeds 11 12] [--plates 5] [--train-plates 2] [--compounds 30] [--sites 2]
        [--unseen-every 3] [--resamples 1000] [--work DIR] [--device cpu|cuda]
        [--json bench-output/bench_dino_twin.json] [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from octstage.cellpainting.cells import changes
from octstage.cellpainting.families import twin_families
from octstage.cellpainting.metadata import DMSO
from octstage.cellpainting.synth import library
from octstage.cli import main as octstage
from octstage.manifest import load
from octtrain.cli import setup_logging
from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config, to_dict
from octtrain.errors import OcttrainError
from octtrain.eval.cellpainting.profile_run import profile_fields
from octtrain.runtime.backend import make_backend
from octtrain.train.dino import DinoJob
from octtrain.train.job import Settings
from octtrain.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("activity", "distinctiveness")
POSCON = "JCP2022_037716"  # the twin's positive control: a reference phenotype, always trained on
CP_MARGIN = 0.05  # "within 0.05 of cp-measure" (the bar)


def build_twin(
    tmp: Path,
    plates: int,
    twin_seed: int,
    compounds: int = 0,
    sites: int = 3,
    learned: bool = True,
) -> tuple[Path, list[Any]]:
    """The twin's cache under ``tmp`` and its fields (``learned``: with the learned family)."""
    src, root = tmp / "src", tmp / "cache"
    synth = ["synth", "--kind", "cellpainting", "--seed", str(twin_seed), "--plates", str(plates)]
    synth += ["--compounds", str(compounds), "--sites", str(sites)]
    synth += ["--learned"] if learned else []
    assert octstage([*synth, str(src)]) == 0
    twin = src / "cpg0016-jump"  # its tables name s3://cellpainting-gallery/: map them
    build = ["build-cache", "--kind", "cellpainting", "--source", str(twin)]
    build += ["--map-prefix", f"s3://cellpainting-gallery/cpg0016-jump/={twin}/"]
    build += ["--metadata", str(src / "datasets" / "metadata"), "--out", str(root)]
    octstage(build)  # exit 1: the planted truncated TIFF
    return root, list(load(root / "manifest.json").fields)


def train_dino(
    tmp: Path, root: Path, train: list[Any], seed: int, args: argparse.Namespace
) -> tuple[Path, bool]:
    """DINO on the training fields; (the last checkpoint, whether an earlier run's was reused:
    ``--work`` keeps finished runs, so a changed evaluation rescores them without training)."""
    run = tmp / f"run{seed}"
    cfg = dino_config(run, seed, args)
    args.config = {k: v for k, v in to_dict(cfg).items() if k in ("model", "crops", "dino")}
    last = run / "checkpoints" / f"step_{args.steps:08d}.pt"
    if last.exists():
        return last, True
    backend = make_backend(cfg.train.device, cfg.train.precision)
    Trainer(DinoJob(cfg, train, root, backend), Settings.of(cfg), backend).run()  # type: ignore[arg-type]
    return last, False


def dino_config(run: Path, seed: int, args: argparse.Namespace) -> DinoConfig:
    """``dino-tiny.yaml`` with the bench's settings, then the user's overrides."""
    return load_config(
        DinoConfig,
        ROOT / "configs" / "pretrain" / "dino-tiny.yaml",
        [
            f"train.run_dir={run}",
            f"train.seed={seed}",
            f"train.max_steps={args.steps}",
            f"checkpoint.every={args.steps}",
            "logging.log_every=50",
            "logging.image_every=0",
            "data.batch_size=16",
            "train.cpu_threads=1",
            "data.num_workers=1",
            f"train.device={args.device}",
            f"schedule.warmup_steps={args.steps // 10}",
            f"dino.warmup_teacher_temp_steps={args.steps // 3}",
            *args.overrides,
        ],
    )


def _ci(m: dict[str, float], key: str) -> str:
    return f"{m[f'{key}_map']:.3f} [{m[f'{key}_map_low']:.3f}, {m[f'{key}_map_high']:.3f}]"


def phenotype_kinds(twin_seed: int, compounds: int) -> dict[str, str]:
    """The twin's perturbations that change intensity only (``intensity``: the AGP membrane's
    brightness) or size only (``size``: nucleus or cell radius), from its library."""
    out = {}
    for pert, (_, phenotype, _) in library(twin_seed, compounds).items():
        changed = set(changes(phenotype))
        if changed == {"agp_membrane"}:
            out[pert] = "intensity"
        elif changed and changed <= {"nucleus_size", "cell_size"}:
            out[pert] = "size"
    return out


def unseen_perturbations(fields: list[Any], every: int) -> list[str]:
    """Every ``every``-th treated perturbation in sorted order (0: none), the positive control
    excepted: their wells are kept out of DINO's training fields."""
    treated = sorted({f.perturbation for f in fields if f.perturbation and not f.is_control})
    treated = [p for p in treated if p != POSCON]
    return treated[every - 1 :: every] if every > 0 else []


def verdict(section: dict[str, Any], kinds: dict[str, str]) -> tuple[str, dict[str, bool]]:
    """Under one recipe: DINO's tokens against every random init's tokens (paired activity
    interval above 0, over every perturbation and over the learned family: what training
    taught the network), DINO against every random-init seed (non-overlapping intervals and a
    paired interval above 0, per kind), against the handcrafted set (paired activity interval
    above 0) and cp-measure (activity within ``CP_MARGIN`` or above), and on each intensity-only
    and size-only perturbation (activity AP above every random seed's)."""
    enc, diff, per = section["encoders"], section["dino_minus"], section["per_perturbation"]
    randoms = [n for n in enc if n.startswith("random_init") and not n.endswith("_tokens")]
    wins, parts = {}, []
    tokens = section.get("dino_tokens_minus", {})
    for key in ("activity", "learned_activity"):
        rivals = [tokens.get(f"{r}_tokens", {}).get(key) for r in randoms]
        if tokens and all(rivals):
            wins[f"tokens_{key}"] = all(d["low"] > 0 for d in rivals)
            worst = min(d["value"] for d in rivals)
            parts.append(
                f"DINO's tokens above random init's ({key.replace('_', ' ')}) "
                f"{'YES' if wins[f'tokens_{key}'] else 'NO'} (least {worst:+.3f})"
            )
    for kind in KINDS:
        low = enc["dino"][f"{kind}_map_low"]
        wins[f"{kind}_apart"] = all(low > enc[r][f"{kind}_map_high"] for r in randoms)
        wins[f"{kind}_paired"] = all(diff[r][kind]["low"] > 0 for r in randoms)
    apart = [k for k in wins if k.endswith(("_apart", "_paired"))]
    parts.append("above random init " + ("YES" if all(wins[k] for k in apart) else "NO"))
    if "handcrafted" in diff:
        wins["above_handcrafted"] = diff["handcrafted"]["activity"]["low"] > 0
        parts.append(f"activity above handcrafted {'YES' if wins['above_handcrafted'] else 'NO'}")
    if "cp_measure" in enc:
        gap = enc["dino"]["activity_map"] - enc["cp_measure"]["activity_map"]
        wins["near_cp_measure"] = gap >= -CP_MARGIN
        parts.append(
            f"within {CP_MARGIN} of cp-measure {'YES' if wins['near_cp_measure'] else 'NO'} "
            f"({gap:+.3f})"
        )
    dino_ap = per["dino"].get("activity", {})
    for what in ("intensity", "size"):
        perts = [p for p, k in kinds.items() if k == what and p in dino_ap]
        beaten = [
            p for p in perts if all(dino_ap[p] > per[r]["activity"].get(p, 1.0) for r in randoms)
        ]
        wins[f"{what}_above_random"] = len(beaten) == len(perts)
        parts.append(f"{what}-only above random init {len(beaten)}/{len(perts)}")
    return "; ".join(parts), wins


def print_section(name: str, section: dict[str, Any], report: dict[str, Any]) -> None:
    """One recipe's table, paired differences and per-perturbation activity APs."""
    enc, floor = section["encoders"], section["floor"]
    subsets = ["activity", "distinctiveness"]
    subsets += ["unseen_activity"] if report.get("unseen_perturbations") else []
    subsets += [f"{family}_activity" for family in report.get("families", {})]
    print(f"-- recipe {name} --")
    print(
        "chance floor (noise features on the same wells, controls and draws): "
        + ", ".join(f"{k} {floor[f'{k}_map']:.3f}" for k in subsets)
    )
    head = f"{'encoder':<22}" + "".join(f" {k + ' [95% CI]':>26}" for k in subsets)
    print(head + f" {'well kNN':>8} {'features':>8}")
    for enc_name, m in enc.items():
        row = f"{enc_name:<22}" + "".join(f" {_ci(m, k):>26}" for k in subsets)
        print(row + f" {m['well_probe_knn_balanced_accuracy']:>8.3f} {m['features_kept']:>8.0f}")
    for title, diffs in (
        ("DINO minus rival", section["dino_minus"]),
        ("DINO's tokens minus rival (the network's part)", section.get("dino_tokens_minus", {})),
    ):
        print(f"{title}, paired (the same plates, controls, perturbations and wells drawn):")
        for rival, d in diffs.items():
            cells = [
                f"{k} {d[k]['value']:+.3f} [{d[k]['low']:+.3f}, {d[k]['high']:+.3f}]"
                for k in d
                if k in subsets
            ]
            print(f"  {rival:<22} " + "   ".join(cells))
    perts = [p for p in report["perturbations"] if p != DMSO]
    print("activity AP per perturbation: " + " ".join(f"{p[-6:]:>7}" for p in perts))
    for enc_name, per in section["per_perturbation"].items():
        row = per.get("activity", {})
        print(f"  {enc_name:<27} " + " ".join(f"{row.get(p, float('nan')):>7.3f}" for p in perts))
    for note in sorted({n for ns in section["notes"].values() for n in ns}):
        print(f"  recipe: {note}")


def run_twin(twin_seed: int, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Every DINO seed of ``args.seeds`` on one twin: trained, scored, printed; the records."""
    if args.work and (tmp / "cache" / "manifest.json").exists():
        root = tmp / "cache"  # a twin of an earlier run with --work: the same flags
        fields = list(load(root / "manifest.json").fields)
    else:
        root, fields = build_twin(
            tmp, args.plates, twin_seed, args.compounds, args.sites, not args.no_learned
        )
    plates = sorted({f.plate for f in fields})
    trained_on = set(plates[: args.train_plates])
    unseen = unseen_perturbations(fields, args.unseen_every)
    train = [f for f in fields if f.plate in trained_on and f.perturbation not in set(unseen)]
    scored = [f for f in fields if f.plate not in trained_on]
    kinds = phenotype_kinds(twin_seed, args.compounds)
    print(
        f"twin seed {twin_seed}: {len(plates)} plates; DINO trains on "
        f"{', '.join(sorted(trained_on))} ({len(train)} fields, without the wells of "
        f"{len(unseen)} perturbations: {', '.join(p[-6:] for p in unseen)}); scored on the "
        f"held-out {', '.join(p for p in plates if p not in trained_on)}; intensity-only "
        f"{sorted(p[-6:] for p, k in kinds.items() if k == 'intensity')}, size-only "
        f"{sorted(p[-6:] for p, k in kinds.items() if k == 'size')}"
    )
    fixed: dict[str, Any] = {}  # handcrafted and cp-measure: computed once, for every seed
    records = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        ckpt, reused = train_dino(tmp, root, train, seed, args)
        trained = time.perf_counter() - t0
        report = profile_fields(
            str(ckpt),
            scored,
            root,
            device=args.device,
            resamples=args.resamples,
            only_held_out=False,
            fixed=fixed,
            unseen=unseen,
            families=twin_families({f.perturbation for f in scored if not f.is_control}),
        )
        took = time.perf_counter() - t0
        how = "an earlier run's checkpoint reused" if reused else f"trained in {trained:.0f} s"
        print(
            f"\ntwin seed {twin_seed}, DINO seed {seed}: {args.steps} steps ({how}), profiles "
            f"in {took - trained:.0f} s; {report['fields']} fields, "
            f"{report['encoders']['dino']['wells']:.0f} wells, random-init seeds "
            f"{report['random_seeds']}, {args.resamples} bootstrap resamples"
        )
        wins = {}
        for name, section in report["recipes"].items():
            print_section(name, section, report)
            line, wins[name] = verdict(section, kinds)
            print(f"verdict ({name}): {line}")
        records.append(
            {
                "twin_seed": twin_seed,
                "seed": seed,
                "train_s": trained,
                "reused": reused,
                "report": report,
                "wins": wins,
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12000)
    # The recipe was tuned on twin seed 7 with DINO seed 0: the defaults are seeds it never saw.
    parser.add_argument("--seeds", type=int, nargs="+", default=[3], help="DINO train.seed(s)")
    parser.add_argument(
        "--twin-seeds", type=int, nargs="+", default=[11, 12], help="octstage synth --seed(s)"
    )
    parser.add_argument("--plates", type=int, default=5)
    parser.add_argument("--train-plates", type=int, default=2)
    parser.add_argument("--compounds", type=int, default=30, help="octstage synth --compounds")
    parser.add_argument("--sites", type=int, default=2, help="octstage synth --sites")
    parser.add_argument(
        "--no-learned",
        action="store_true",
        help="a twin without the learned family (octstage synth --learned; the twins of the "
        "benchmarks before it)",
    )
    parser.add_argument(
        "--unseen-every",
        type=int,
        default=3,
        help="keep every N-th treated perturbation out of DINO's training fields (0: none); "
        "they are scored apart as held-out compounds",
    )
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where DINO trains and the encoders embed the fields (cuda: a GPU-sized run; set "
        "model/dino/data sizes with overrides)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="keep the twins, their caches and the runs here (twin<seed>/); a later run with the "
        "same flags reuses the twin and rescores a finished run's checkpoint without training "
        "it again; default: a temporary folder",
    )
    parser.add_argument(
        "--json", type=Path, default=Path("bench-output/bench_dino_twin.json")
    )  # /bench-output/ is git-ignored
    parser.add_argument("overrides", nargs="*", help="dotted config overrides (after the YAML)")
    args = parser.parse_args()
    if not 1 <= args.train_plates < args.plates:
        parser.error("--train-plates must leave at least one held-out plate")
    if args.unseen_every < 0 or args.resamples < 1 or args.steps < 1:
        parser.error("--unseen-every must be >= 0, --resamples and --steps >= 1")
    unfinished = [
        run
        for t in args.twin_seeds
        for s in args.seeds
        if args.work
        and (run := args.work / f"twin{t}" / f"run{s}").exists()
        and not (run / "checkpoints" / f"step_{args.steps:08d}.pt").exists()
    ]
    if unfinished:  # the trainer would resume it with this run's settings: refuse
        parser.error(f"{unfinished[0]} holds an unfinished run: remove it or pick another --work")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    try:  # a bad override is refused before the twin is built
        dino_config(Path("run"), args.seeds[0], args)
    except OcttrainError as exc:
        parser.error(str(exc))
    setup_logging(verbose=False)  # the trainer's metrics line every logging.log_every steps
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core: the figures below are a one-core run's
    start = time.perf_counter()
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        for twin_seed in args.twin_seeds:
            tmp = (args.work or Path(scratch)) / f"twin{twin_seed}"
            tmp.mkdir(parents=True, exist_ok=True)
            records += run_twin(twin_seed, args, tmp)
    total = time.perf_counter() - start
    print(f"\n{len(records)} DINO run(s), {total:.0f} s in all")
    for name in records[0]["wins"] if records else []:
        held = {k: all(r["wins"][name][k] for r in records) for k in records[0]["wins"][name]}
        print(
            f"over every run, recipe {name}: "
            + ", ".join(f"{k} {'YES' if v else 'NO'}" for k, v in held.items())
        )
    record = {
        "twin_seeds": args.twin_seeds,
        "plates": args.plates,
        "compounds": args.compounds,
        "sites": args.sites,
        "learned": not args.no_learned,
        "train_plates": args.train_plates,
        "unseen_every": args.unseen_every,
        "steps": args.steps,
        "device": args.device,
        "overrides": args.overrides,
        "config": getattr(args, "config", {}),
        "total_s": total,
        "runs": records,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print(f"report: {args.json}")


if __name__ == "__main__":
    main()
