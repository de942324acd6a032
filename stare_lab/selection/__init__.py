"""Selection: the exact top-k of the highest surprisals (radix select; the fused CPU kernel; over ranks).

:func:`native_enabled` reads the switch of the fused CPU kernel (``STARE_LAB_NATIVE``) without importing torch, so
that the ``stare-lab`` front door refuses a bad value before any command runs.
"""

import os

PUBLIC_MODULES = ["distributed", "native", "radix"]

#: the values of ``STARE_LAB_NATIVE`` (case-insensitive); unset or empty is on
NATIVE_VALUES = {"1": True, "on": True, "true": True, "yes": True, "0": False, "off": False, "false": False, "no": False}


def native_enabled() -> bool:
    """Whether ``STARE_LAB_NATIVE`` allows the fused CPU selection kernel (:mod:`stare_lab.selection.native`): on
    when unset or empty, else one of :data:`NATIVE_VALUES`.

    Raises:
        ConfigError: any other value (``STARE_LAB_NATIVE=banana`` is not silently the default).
    """
    raw = os.environ.get("STARE_LAB_NATIVE", "").strip()
    if not raw:
        return True
    value = NATIVE_VALUES.get(raw.lower())
    if value is None:
        from stare_lab.errors import ConfigError

        raise ConfigError(f"STARE_LAB_NATIVE={raw!r} is not one of 1, 0 (also on/off, true/false, yes/no): 0 turns "
                          "the fused CPU selection kernel off, unset or 1 leaves it on")
    return value
