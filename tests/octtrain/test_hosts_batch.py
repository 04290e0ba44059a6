"""How a global batch splits over processes (``hosts.local_batch``): refused when it does not
divide, instead of training a smaller batch than asked (15 over 2 would train 14)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from octtrain.errors import ConfigError
from octtrain.runtime.hosts import local_batch


def _backend(processes: int, world: int, step_is_global: bool = False) -> SimpleNamespace:
    return SimpleNamespace(process_count=processes, world_size=world, step_is_global=step_is_global)


def test_a_global_batch_that_does_not_divide_over_the_processes_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"data\.batch_size 15 is not divisible by the 2 proc"):
        local_batch(15, _backend(2, 2))  # type: ignore[arg-type]
    assert local_batch(16, _backend(2, 2)) == 8  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="6 samples per host, which do not split over its 4"):
        local_batch(24, _backend(4, 16, step_is_global=True))  # type: ignore[arg-type]
