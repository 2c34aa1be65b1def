"""A CPU "platform" for VeRL 0.9 (gloo instead of NCCL), used only by the CPU smoke run.

VeRL 0.9.1 registers CUDA, NPU and ROCm platforms and falls back to CUDA (NCCL)
otherwise. Loading this module through ``VERL_USE_EXTERNAL_MODULES`` with
``VERL_PLATFORM=cpu`` registers a ``cpu`` platform: device ``cpu``, collective
backend ``gloo``, Ray resource ``GPU`` (advertise fake ones with
``+ray_kwargs.ray_init.num_gpus=N``). It is an experiment, not a supported path.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """Run VeRL workers on CPU with gloo collectives."""

    @property
    def device_name(self) -> str:
        """Return the torch device type."""
        return "cpu"

    @property
    def vendor_name(self) -> str:
        """Return the vendor name."""
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        """Return torch's CPU device module."""
        return torch.cpu

    def is_available(self) -> bool:
        """Return True: a CPU is always there."""
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        """Never auto-detect; select with VERL_PLATFORM=cpu."""
        return False

    def current_device(self) -> int:
        """Return device index 0."""
        return 0

    def device_count(self) -> int:
        """Return one device."""
        return 1

    def set_device(self, device_index: int) -> None:
        """Do nothing on CPU."""

    def synchronize(self, device_index: int | None = None) -> None:
        """Do nothing on CPU."""

    def manual_seed(self, seed: int) -> None:
        """Seed torch."""
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed torch."""
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """Do nothing on CPU."""

    def empty_cache(self) -> None:
        """Do nothing on CPU."""

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        """Return no capability."""
        return None, None

    def communication_backend_name(self) -> str:
        """Return gloo."""
        return "gloo"

    def visible_devices_envvar(self) -> str:
        """Return the (ignored) visible-devices variable Ray sets."""
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        """Do nothing."""
        yield

    def profiler_start(self) -> None:
        """Do nothing."""

    def profiler_stop(self) -> None:
        """Do nothing."""

    def ray_resource_name(self) -> str:
        """Return GPU: VeRL's resource pools ask Ray for GPUs (fake ones on CPU)."""
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        """Return Ray options asking for (fake) GPUs."""
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        """Return no variables."""
        return []

    def is_ipc_supported(self) -> bool:
        """Return False: no CUDA IPC on CPU."""
        return False

    def cudart(self) -> Any:
        """Return None."""
        return None


def _gloo_only() -> None:
    """Make VeRL's process-group init use plain gloo ("cpu:gloo,cpu:gloo" is rejected by torch)."""
    import verl.utils.distributed as dist

    original = dist.initialize_global_process_group_ray

    def initialize(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    dist.initialize_global_process_group_ray = initialize


_gloo_only()
