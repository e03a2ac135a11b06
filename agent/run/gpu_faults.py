"""GPU faults NVML can see without a CUDA context: retired pages or remapped rows waiting for a
reset, uncorrected ECC errors since the driver loaded. No NVML (no module, no driver): none."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def gpu_faults(pci_ids: Collection[str], nvml: Any = None) -> list[str]:
    """One line per fault on the GPUs with these PCI bus ids (`nvml`: the pynvml module)."""
    if nvml is None:
        try:
            import pynvml  # optional: launch-agent[nvml]

            pynvml.nvmlInit()
            nvml = pynvml
        except Exception:
            return []
    wanted = {_bus(p) for p in pci_ids}
    found = []
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError:
        return []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus = _bus(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError:
            continue
        if bus in wanted:
            found += [f"GPU {bus}: {fault}" for fault in _faults(nvml, handle)]
    return found


def _faults(nvml: Any, handle: Any) -> list[str]:
    faults = []
    try:
        if nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
            faults.append("retired pages pending (reset the GPU)")
    except nvml.NVMLError:
        pass  # not supported (A100 and later remap rows instead)
    try:
        _, _, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
        if failed:
            faults.append("row remapping failed")
        elif pending:
            faults.append("remapped rows pending (reset the GPU)")
    except nvml.NVMLError:
        pass
    try:
        errors = nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        )
        if errors:
            faults.append(f"{errors} uncorrected ECC error(s) since the driver loaded")
    except nvml.NVMLError:
        pass  # ECC off or unsupported
    return faults


def _bus(value: str | bytes) -> str:
    """NVML says 00000000:07:00.0, sysfs 0000:07:00.0: compare the last 12 characters."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.lower()[-12:]
