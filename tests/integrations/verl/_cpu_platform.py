"""A CPU platform for verl 0.9 (tests only): verl's platform layer (``verl.plugin.platform``) knows CUDA, NPU and
ROCm; registering this class with verl's public ``PlatformRegistry`` and selecting it with ``VERL_PLATFORM=cpu``
lets verl's own FSDP2 engine and workers run on CPU with gloo. It is loaded the way verl documents for external
platforms: ``VERL_USE_EXTERNAL_MODULES=_cpu_platform`` (imported by ``import verl`` before anything asks for the
platform). ``VERL_ENGINE_DEVICE=cuda`` then selects verl's FSDP engine, which verl registers for ``cuda``/``npu`` only
(``verl/workers/engine/base.py`` ``EngineRegistry.get_engine_cls`` reads that variable)."""

from __future__ import annotations

import contextlib
import types

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _device_module() -> types.SimpleNamespace:
    """What verl calls on ``get_torch_device()`` (``torch.cuda`` on CUDA): memory figures are 0 on CPU."""
    zero = lambda *a, **k: 0  # noqa: E731
    none = lambda *a, **k: None  # noqa: E731
    return types.SimpleNamespace(
        is_available=lambda: True, current_device=lambda: "cpu", device_count=lambda: 1, set_device=none,
        synchronize=none, manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed, empty_cache=none,
        max_memory_allocated=zero, max_memory_reserved=zero, memory_allocated=zero, memory_reserved=zero,
        reset_peak_memory_stats=none, mem_get_info=lambda *a, **k: (0, 0), get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state, get_device_name=lambda *a, **k: "CPU")


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's ``PlatformBase`` on CPU: device ``cpu``, collective backend ``gloo``, Ray resource ``GPU`` (a logical
    one: ``ray.init(num_gpus=…)``), no IPC."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.SimpleNamespace:
        return self._module

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None
