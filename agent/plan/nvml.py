"""NVML (nvidia-ml-py, optional): GPU and MIG UUIDs → PCI bus ids, for CUDA_VISIBLE_DEVICES UUIDs."""

from __future__ import annotations

from typing import Any

from agent.plan.topology import NvmlLike


class _Nvml:
    """NvmlLike over nvidia-ml-py (NVML creates no CUDA context); enumerated once."""

    def __init__(self, pynvml: Any) -> None:
        self._nvml = pynvml
        self._found: dict[str, str] | None = None

    def uuids(self) -> dict[str, str]:
        if self._found is None:
            nvml, self._found = self._nvml, {}
            for index in range(nvml.nvmlDeviceGetCount()):
                try:  # a GPU the device cgroup hides answers NO_PERMISSION: not ours
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
                    uuids = [_text(nvml.nvmlDeviceGetUUID(handle)), *self._mig_uuids(handle)]
                except nvml.NVMLError:
                    continue
                self._found.update(dict.fromkeys(uuids, bus))
        return self._found

    def _mig_uuids(self, handle: Any) -> list[str]:
        nvml, uuids = self._nvml, []
        try:
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nvml.NVMLError:  # not MIG-capable
            return []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:  # empty slot
                continue
            uuids.append(_text(nvml.nvmlDeviceGetUUID(mig)))
        return uuids


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def load_nvml() -> NvmlLike | None:
    """The real NVML when nvidia-ml-py and a driver are present, else None."""
    try:
        import pynvml  # optional: launch-agent[nvml]

        pynvml.nvmlInit()
    except Exception:  # no module, no library, no driver: all mean "no NVML"
        return None
    return _Nvml(pynvml)
