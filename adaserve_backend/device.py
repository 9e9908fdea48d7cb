"""The device the engine runs on: checked when the engine loads, and waited for where time is measured.

engine.json names it per model (ModelConfig.device: "cpu", "cuda" or "cuda:N"; config/engine.py checks the
spelling without importing torch). Here it is checked against the machine before any weights are read, so
a config asking for a GPU the process cannot see fails at load with the reason, not at the first forward.

On CUDA, kernels run asynchronously: a wall-clock time taken right after a forward is launched measures
the launch, not the work. Everything that times forwards (the startup calibration, the engine's step
records the estimator learns from) waits for the device first through `synchronize`; on the CPU that is a
no-op, so the CPU path measures exactly what it measured before.
"""

from __future__ import annotations

import torch


def check_device(name: str) -> torch.device:
    """The torch device `name` stands for (a CUDA one with its index), after checking this process can use
    it; ValueError with the reason where it cannot (no CUDA build or driver, or an index past the visible
    devices)."""
    device = torch.device(name)
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device {name!r}: the engine runs on cpu or cuda")
    if not torch.cuda.is_available():
        why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise ValueError(f"device {name!r} asked for, but torch.cuda.is_available() is False ({why}); "
                         f"set \"device\": \"cpu\" in engine.json or run where a GPU is visible")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    # with its index, as the weights placed there report it
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def synchronize(device: torch.device | str) -> None:
    """Wait until `device` has finished the work queued on it (nothing to wait for on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def on_cpu(device: torch.device | str) -> bool:
    return torch.device(device).type == "cpu"
