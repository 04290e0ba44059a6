"""Config loading: YAML + dotted overrides, type conversion, validation messages, every YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from octtrain.config.loader import apply_override, from_dict, load_config, to_dict
from octtrain.config.pretrain import PretrainConfig
from octtrain.config.sections import CheckpointConfig, ModelConfig
from octtrain.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _config_class(path: Path) -> type:
    if path.parent.name == "finetune":
        from octtrain.config.finetune import FinetuneConfig

        return FinetuneConfig
    from octtrain.config.dino import DinoConfig, job_of

    return DinoConfig if job_of(path, []) == "dino" else PretrainConfig


TRAINER_YAMLS = sorted(
    [*(CONFIGS / "pretrain").glob("*.yaml"), *(CONFIGS / "finetune").glob("*.yaml")]
)


@pytest.mark.parametrize("path", TRAINER_YAMLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_trainer_yaml_loads_validates_and_round_trips(path: Path) -> None:
    cls = _config_class(path)
    cfg = load_config(cls, path, [])
    assert from_dict(cls, to_dict(cfg)) == cfg


def test_pretrain_configs_exist() -> None:
    names = {p.stem for p in (CONFIGS / "pretrain").glob("*.yaml")}
    assert {"tiny", "demo", "fast_start", "vit29m", "vit90m", "dino-tiny", "dino-vits8"} <= names


def test_dotted_overrides_are_parsed_as_yaml_and_typed(tmp_path: Path) -> None:
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("train:\n  max_steps: 5\noptim:\n  lr: 1e-3\n")
    cfg = load_config(
        PretrainConfig,
        yaml_path,
        [
            "train.max_steps=20",
            "data.num_workers=2",
            "model.patch=[2, 8, 8]",
            "model.input_shape=[8,32,32]",
            "data.augment.flip_w=0",
            "logging.wandb_mode=offline",
            "schedule.total_steps=null",
        ],
    )
    assert cfg.train.max_steps == 20
    assert cfg.data.num_workers == 2
    assert cfg.optim.lr == pytest.approx(1e-3)  # "1e-3" is a string in YAML 1.1
    assert cfg.model.patch == (2, 8, 8) and cfg.model.input_shape == (8, 32, 32)
    assert cfg.data.augment.flip_w == 0.0
    assert cfg.logging.wandb_mode == "offline"
    assert cfg.schedule.total_steps is None


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.max_stepz=3", "'train.max_stepz'"),
        ("data.augment.flop=1", "'data.augment.flop'"),
        ("nosuch.key=1", "'nosuch'"),
        ("train.max_steps=abc", "train.max_steps: expected an integer"),
        ("train.max_steps=0", "max_steps must be positive"),
        ("train.device=tpu", "device must be one of"),
        ("model.patch=[4,16]", "model.patch: expected 3 values"),
        ("optim.loss=huber", "loss must be one of"),
        ("train.max_steps", "dotted.key=value"),
    ],
)
def test_bad_values_and_unknown_keys_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(PretrainConfig, None, [override])
    assert needle in str(info.value)


def test_input_shape_not_divisible_by_patch_is_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match=r"input_shape \[16, 60, 64\] is not divisible by patch"):
        ModelConfig(input_shape=(16, 60, 64), patch=(4, 16, 16))
    with pytest.raises(ConfigError, match="model: input_shape"):
        load_config(PretrainConfig, None, ["model.input_shape=[16,60,64]"])


@pytest.mark.parametrize("value", ["", "None", "none", "null"])
def test_blank_checkpoint_dir_is_none_never_a_bucket_named_none(value: str) -> None:
    cfg = load_config(PretrainConfig, None, [f"checkpoint.dir={value}"])
    assert cfg.checkpoint.dir is None
    assert CheckpointConfig(dir=value).dir is None


def test_gs_dir_without_bucket_is_refused() -> None:
    with pytest.raises(ConfigError, match="no bucket"):
        CheckpointConfig(dir="gs://None/ckpt")


def test_apply_override_builds_nested_sections() -> None:
    data: dict[str, object] = {}
    apply_override(data, "a.b.c=[1, 2]")
    assert data == {"a": {"b": {"c": [1, 2]}}}


def test_wandb_mode_comes_from_config_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert load_config(PretrainConfig, None, []).logging.resolved_wandb_mode() == "disabled"
    cfg = load_config(PretrainConfig, None, ["logging.wandb_mode=offline"])
    assert cfg.logging.resolved_wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ConfigError, match="WANDB_MODE"):
        load_config(PretrainConfig, None, []).logging.resolved_wandb_mode()


def test_a_section_the_yaml_names_keeps_the_parents_other_defaults(tmp_path: Path) -> None:
    # DinoConfig's optim/schedule defaults (betas, clip, EMA) are its own, not the section
    # class's: a YAML that sets only the lr must not reset them to V-JEPA's.
    from octtrain.config.dino import DinoConfig

    yaml_path = tmp_path / "dino.yaml"
    yaml_path.write_text("job: dino\noptim:\n  lr: 1.0e-3\nschedule:\n  warmup_steps: 2\n")
    cfg = load_config(DinoConfig, yaml_path, ["schedule.ema_end=0.999"])
    default = DinoConfig()
    assert cfg.optim.lr == 1e-3
    assert (cfg.optim.betas, cfg.optim.grad_clip) == (default.optim.betas, default.optim.grad_clip)
    assert cfg.schedule.ema_start == default.schedule.ema_start == 0.992
    assert (cfg.schedule.warmup_steps, cfg.schedule.ema_end) == (2, 0.999)
    assert cfg.train.max_steps == default.train.max_steps  # a section the YAML never names


def test_a_config_named_from_the_checkout_is_found_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``--config configs/pretrain/tiny.yaml`` from another folder: the checkout's file, said
    in the log; a name found nowhere names both places looked in."""
    from octtrain.config.loader import REPO

    monkeypatch.chdir(tmp_path)
    with caplog.at_level("INFO", logger="octtrain"):
        cfg = load_config(PretrainConfig, "configs/pretrain/tiny.yaml", [])
    assert cfg == load_config(PretrainConfig, REPO / "configs" / "pretrain" / "tiny.yaml", [])
    assert f"read {REPO / 'configs' / 'pretrain' / 'tiny.yaml'}" in caplog.text
    with pytest.raises(ConfigError, match=rf"looked in the current folder, {tmp_path}, and in"):
        load_config(PretrainConfig, "configs/pretrain/nope.yaml", [])
    # A file of that name here is the one read.
    (tmp_path / "configs" / "pretrain").mkdir(parents=True)
    (tmp_path / "configs" / "pretrain" / "tiny.yaml").write_text("train:\n  max_steps: 7\n")
    assert load_config(PretrainConfig, "configs/pretrain/tiny.yaml", []).train.max_steps == 7


def test_a_run_shorter_than_its_warmup_is_said_with_the_way_out() -> None:
    from octtrain.config.pretrain import ScheduleConfig

    said = ScheduleConfig(warmup_steps=100).short_run(3)
    assert said is not None and "schedule.warmup_steps (100) exceeds train.max_steps (3)" in said
    assert "peaks at 3% of optim.lr" in said and "schedule.total_steps" in said
    assert ScheduleConfig(warmup_steps=3).short_run(3) is None
    assert ScheduleConfig(warmup_steps=100, total_steps=1000).short_run(3) is None
