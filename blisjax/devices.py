"""Which devices the JAX engine runs on: the platform (CPU or GPU) and one XLA CPU device per
usable core, both requested before JAX starts.

XLA gives a process a single CPU device unless told otherwise, and the JAX engine runs one
lockstep event loop per device. On one device a multi-core CPU is poorly used: on a 2-core
machine, 64 lanes of scenario S take 4.1 s on one device and 1.8–2.0 s split over two
(``docs/performance.md``), with identical results. The device count is read
once, when JAX initialises its CPU backend, from ``XLA_FLAGS`` — so this module must not import
JAX, and its request only counts if it comes first.
"""

from __future__ import annotations

import os
import sys

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
PLATFORMS = ("cpu", "gpu")
GPU_INSTALL_HINT = ('install JAX\'s CUDA plugin with blisjax\'s extra: pip install -e ".[cuda13]" '
                    '(or ".[cuda12]" for a CUDA 12 driver)')


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS, Windows)
        return os.cpu_count() or 1


def with_device_count(xla_flags: str, count: int) -> str | None:
    """``xla_flags`` with a request for ``count`` CPU devices appended; ``None`` if nothing is
    to change: the flags already name a device count (an explicit choice wins) or ``count`` is 1."""
    if count < 1:
        raise ValueError(f"cpu devices: must be >= 1, got {count}")
    if DEVICE_COUNT_FLAG in xla_flags or count == 1:
        return None
    return f"{xla_flags} {DEVICE_COUNT_FLAG}={count}".strip()


def use_cpu_cores(count: int | None = None) -> int | None:
    """Ask XLA for ``count`` CPU devices (default: one per usable core) by setting ``XLA_FLAGS``.

    Call before anything imports JAX (``blisjax.engine`` does). Returns the count requested, or
    ``None`` when nothing changed: JAX already imported (too late to matter), ``XLA_FLAGS``
    already names a device count, or one device was asked for / one core is usable. Harmless
    on GPU machines: it only splits the host CPU, and JAX's default devices stay the GPUs.
    """
    count = usable_cores() if count is None else count
    flags = with_device_count(os.environ.get("XLA_FLAGS", ""), count)
    if flags is None or "jax" in sys.modules:
        return None
    os.environ["XLA_FLAGS"] = flags
    return count


def use_platform(name: str | None) -> str | None:
    """Run the JAX engine on ``name`` ("cpu" or "gpu"; ``None``: whatever JAX finds, a GPU
    first). "cpu" sets ``JAX_PLATFORMS=cpu`` before JAX starts, so no accelerator is even
    initialised; "gpu" starts JAX and checks that its default backend is a GPU. Returns the
    platform asked for.

    Raises ``ValueError`` naming ``--device`` for another name, for "gpu" where JAX finds none
    (with the install line for JAX's CUDA plugin), and for "cpu" once JAX has started on
    another platform."""
    if name is None:
        return None
    if name not in PLATFORMS:
        raise ValueError(f"--device: one of {', '.join(PLATFORMS)}, got {name!r}")
    if name == "cpu":
        if "jax" in sys.modules:
            import jax

            if jax.default_backend() != "cpu":
                raise ValueError("--device cpu: JAX has already started on "
                                 f"{jax.default_backend()}; set it before JAX is imported")
        else:
            os.environ["JAX_PLATFORMS"] = "cpu"
        return name
    import jax

    backend = jax.default_backend()
    if backend != "gpu":
        raise ValueError(f"--device gpu: JAX finds no GPU (its backend is {backend}); "
                         f"{GPU_INSTALL_HINT}")
    return name
