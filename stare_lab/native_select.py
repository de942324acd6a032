"""A fused CPU kernel for the STARE selection (docs/theory.md §4), compiled on first use.

The tensor implementation in :mod:`stare_lab.radix_select` is exact, linear-time and free of host synchronisation, which is
what an accelerator needs; on a CPU it still runs about sixteen separate tensor operations over the batch. This module
does the same selection in three tight C loops over the batch (key + histogram of the high 16 bits; histogram of the
low 15 bits inside the threshold bin; one row-major write that takes the ties in order), with the same keys, the same
k and the same tie rule, so its result is identical bit for bit (the tests compare the two and an independent sort).
There is no device to synchronise with on a CPU; the kernel reads no value back into Python.

The C source below is compiled with the system C compiler (``$CC``, split like a shell word list; default ``cc``) into a shared library cached under
``$STARE_LAB_CACHE_DIR`` (default ``~/.cache/stare_lab``, or the temp directory if that is not writable) and loaded
with :mod:`ctypes`; building takes well under a second and happens once per source version. Without a working
compiler :func:`available` is False and :mod:`stare_lab.radix_select` uses the tensor implementation (one warning is logged).
``STARE_LAB_NATIVE=0`` disables the kernel.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

__all__ = ["available", "select_into", "load_error"]

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* k = max(1, ceil(P n (1 - 1e-12))), at most n; 0 for n = 0 or P <= 0 (p_scaled = P (1 - 1e-12)). */
static int64_t num_selected(int64_t n, double p_scaled)
{
    if (n <= 0 || !(p_scaled > 0.0)) return 0;
    int64_t k = (int64_t)ceil((double)n * p_scaled);
    if (k < 1) k = 1;
    return k > n ? n : k;
}

/* The bin holding the k-th largest key of a histogram (bins ordered by key; the top bin when k = 0) and the number
   of keys in higher bins. */
static int32_t threshold_bin(const uint32_t *hist, int32_t bins, int64_t k, int64_t *above)
{
    int64_t cum = 0;
    for (int32_t b = bins - 1; b >= 0; --b) {
        if (cum + hist[b] >= k) { *above = cum; return b; }
        cum += hist[b];
    }
    *above = cum;
    return 0;
}

/* Two disjoint sets at once (set 1 = L+, set 2 = L-): for each set s, exactly k_s = num_selected(n_s) of its
   candidates with the largest key, key = bits of |log p| (a non-negative float32 orders like its bit pattern),
   ties in row-major order. Candidates of set s: valid[i] && set_id == s (set_id per row, or per token when
   set_per_token). out[i] = on1 / on2 on the selected tokens of set 1 / 2, off elsewhere.
   res = {k1, n1, k2, n2, number of valid tokens}. Returns 0, or 1 if out of memory. */
int stare_select(const float *lp, const uint8_t *valid, const uint8_t *set_id, int set_per_token,
                 int64_t rows, int64_t cols, double p_scaled, int32_t on1, int32_t on2, int32_t off,
                 int32_t *out, int64_t *res)
{
    uint32_t *hist1 = (uint32_t *)calloc(2 * 65536, sizeof(uint32_t));
    uint32_t *hist2 = (uint32_t *)calloc(2 * 32768, sizeof(uint32_t));
    if (!hist1 || !hist2) { free(hist1); free(hist2); return 1; }
    int64_t n[2] = {0, 0}, num_valid = 0;
    /* pass 1: keys (-1 for non-candidates) and, per set, the histogram of their high 16 bits */
    for (int64_t r = 0; r < rows; ++r) {
        const float *lp_r = lp + r * cols;
        const uint8_t *valid_r = valid + r * cols;
        int32_t *out_r = out + r * cols;
        if (set_per_token) {
            const uint8_t *set_r = set_id + r * cols;
            for (int64_t c = 0; c < cols; ++c) {
                uint32_t bits;
                memcpy(&bits, lp_r + c, sizeof bits);
                const uint8_t v = valid_r[c] != 0, s = set_r[c];
                num_valid += v;
                if (v && (s == 1 || s == 2)) {
                    bits &= 0x7FFFFFFFu;
                    out_r[c] = (int32_t)bits;
                    hist1[(s - 1) * 65536 + (bits >> 15)] += 1;
                    n[s - 1] += 1;
                } else {
                    out_r[c] = -1;
                }
            }
        } else if (set_id[r] == 1 || set_id[r] == 2) {
            const int s = set_id[r] - 1;
            uint32_t *h = hist1 + s * 65536;
            int64_t count = 0;
            for (int64_t c = 0; c < cols; ++c) {
                uint32_t bits;
                memcpy(&bits, lp_r + c, sizeof bits);
                if (valid_r[c]) {
                    bits &= 0x7FFFFFFFu;
                    out_r[c] = (int32_t)bits;
                    h[bits >> 15] += 1;
                    count += 1;
                } else {
                    out_r[c] = -1;
                }
            }
            n[s] += count;
            num_valid += count;
        } else {
            for (int64_t c = 0; c < cols; ++c) {
                num_valid += valid_r[c] != 0;
                out_r[c] = -1;
            }
        }
    }
    int64_t k[2], k2[2], need[2], taken[2] = {0, 0};
    int32_t b1[2], t[2];
    for (int s = 0; s < 2; ++s) {
        int64_t above;
        k[s] = num_selected(n[s], p_scaled);
        b1[s] = threshold_bin(hist1 + s * 65536, 65536, k[s], &above);
        k2[s] = k[s] - above;
    }
    /* pass 2: per set, the low 15 bits of the keys inside its threshold bin (non-candidates have key -1) */
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t *out_r = out + r * cols;
        if (set_per_token) {
            const uint8_t *set_r = set_id + r * cols;
            for (int64_t c = 0; c < cols; ++c) {
                const int32_t key = out_r[c];
                if (key < 0) continue;
                const int s = set_r[c] - 1;
                if ((key >> 15) == b1[s]) hist2[s * 32768 + (key & 0x7FFF)] += 1;
            }
        } else if (set_id[r] == 1 || set_id[r] == 2) {
            const int s = set_id[r] - 1;
            const int32_t bin = b1[s];
            uint32_t *h = hist2 + s * 32768;
            for (int64_t c = 0; c < cols; ++c) {
                const int32_t key = out_r[c];
                if ((key >> 15) == bin) h[key & 0x7FFF] += 1;  /* key -1 >> 15 is -1: never a bin */
            }
        }
    }
    for (int s = 0; s < 2; ++s) {
        int64_t above;
        const int32_t b2 = threshold_bin(hist2 + s * 32768, 32768, k2[s], &above);
        t[s] = (int32_t)(((uint32_t)b1[s] << 15) | (uint32_t)b2); /* k-th largest key; INT32_MAX for k = 0 */
        need[s] = k2[s] - above;
    }
    /* pass 3: keys above t, and the first `need` keys equal to t in row-major order, per set */
    for (int64_t r = 0; r < rows; ++r) {
        int32_t *out_r = out + r * cols;
        if (set_per_token) {
            const uint8_t *set_r = set_id + r * cols;
            for (int64_t c = 0; c < cols; ++c) {
                const int32_t key = out_r[c];
                int32_t value = off;
                if (key >= 0) {
                    const int s = set_r[c] - 1;
                    int sel = key > t[s];
                    if (key == t[s] && taken[s] < need[s]) { sel = 1; taken[s] += 1; }
                    if (sel) value = s == 0 ? on1 : on2;
                }
                out_r[c] = value;
            }
        } else if (set_id[r] == 1 || set_id[r] == 2) {
            const int s = set_id[r] - 1;
            const int32_t ts = t[s], on = s == 0 ? on1 : on2;
            for (int64_t c = 0; c < cols; ++c) {
                const int32_t key = out_r[c];
                int32_t value = key > ts ? on : off;
                if (key == ts && taken[s] < need[s]) { value = on; taken[s] += 1; }
                out_r[c] = value;
            }
        } else {
            for (int64_t c = 0; c < cols; ++c) out_r[c] = off;
        }
    }
    free(hist1);
    free(hist2);
    res[0] = k[0]; res[1] = n[0]; res[2] = k[1]; res[3] = n[1]; res[4] = num_valid;
    return 0;
}
"""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None
_tried = False


def _cache_dir() -> Path:
    configured = os.environ.get("STARE_LAB_CACHE_DIR")
    candidates = [Path(configured)] if configured else []
    candidates += [Path.home() / ".cache" / "stare_lab", Path(tempfile.gettempdir()) / "stare_lab"]
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
            if os.access(path, os.W_OK):
                return path
        except OSError:
            continue
    raise OSError(f"no writable cache directory among {[str(p) for p in candidates]}")


def _build() -> ctypes.CDLL:
    compiler = shlex.split(os.environ.get("CC") or "cc")  # e.g. "ccache gcc" or "gcc -m64", as make reads it
    digest = hashlib.sha256((_SOURCE + " ".join(compiler)).encode()).hexdigest()[:16]
    directory = _cache_dir()
    lib_path = directory / f"stare_select-{digest}.so"
    if not lib_path.exists():
        # build under private names, then rename: several processes (e.g. trainer ranks) may build at once
        fd, src = tempfile.mkstemp(suffix=".c", prefix="stare_select-", dir=directory)
        with os.fdopen(fd, "w") as handle:
            handle.write(_SOURCE)
        fd, tmp = tempfile.mkstemp(suffix=".so", prefix="stare_select-", dir=directory)
        os.close(fd)
        cmd = [*compiler, "-O3", "-std=c99", "-shared", "-fPIC", "-o", tmp, src, "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise OSError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
            os.replace(tmp, lib_path)
        finally:
            for path in (src, tmp):
                if os.path.exists(path):
                    os.unlink(path)
    lib = ctypes.CDLL(str(lib_path))
    fn = lib.stare_select
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_double, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
    ]
    return lib


def available() -> bool:
    """Whether the kernel is enabled (``STARE_LAB_NATIVE`` is not ``0``) and built; builds it on the first call."""
    global _lib, _error, _tried
    if os.environ.get("STARE_LAB_NATIVE", "1") == "0":
        return False
    if not _tried:
        with _lock:
            if not _tried:
                try:
                    _lib = _build()
                except (OSError, subprocess.SubprocessError) as exc:
                    _error = str(exc)
                    logger.warning("stare_lab: the fused CPU selection kernel is unavailable (%s); using the tensor "
                                   "implementation", _error)
                _tried = True
    return _lib is not None


def load_error() -> str | None:
    """Why the kernel could not be built or loaded (None if it was, or was not tried yet)."""
    return _error


def select_into(
    lp2: Tensor, valid: Tensor, set_id: Tensor, p_scaled: float, out: Tensor, on1: int, on2: int, off: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Run the kernel for up to two disjoint sets: ``out`` (int32 ``[rows, cols]``, contiguous CPU) gets ``on1`` /
    ``on2`` on the selected tokens of set 1 / set 2 and ``off`` elsewhere.

    Args:
        lp2: float32 ``[rows, cols]`` log-probabilities (CPU; made contiguous here).
        valid: bool ``[rows, cols]``.
        set_id: uint8 ``[rows, 1]`` (per row) or ``[rows, cols]``: 1 for set 1 (e.g. Â > 0), 2 for set 2 (Â < 0),
            0 for neither.
        p_scaled: P·(1 − 1e-12), the factor of n before the ceiling (see ``radix_select.num_selected``).

    Returns:
        ``(k1, n1, k2, n2, num_valid)`` as int64 0-dim tensors.

    Raises:
        RuntimeError: if the kernel is not available, ``out`` is not a contiguous int32 tensor of the right shape,
            or the kernel runs out of memory.
    """
    if not available():
        raise RuntimeError(f"the fused CPU selection kernel is not available: {_error}")
    rows, cols = lp2.shape
    if not (out.is_contiguous() and out.dtype == torch.int32 and out.shape == lp2.shape):
        raise RuntimeError("out must be a contiguous int32 tensor of the shape of the log-probabilities")
    lp_c = lp2.contiguous()
    valid_c = valid.contiguous().view(torch.uint8)
    per_token = set_id.shape == lp2.shape
    set_c = set_id.reshape(rows, -1).to(torch.uint8).contiguous()
    res = torch.zeros(5, dtype=torch.int64)
    status = _lib.stare_select(  # type: ignore[union-attr]
        lp_c.data_ptr(), valid_c.data_ptr(), set_c.data_ptr(), int(per_token), rows, cols, float(p_scaled),
        int(on1), int(on2), int(off), out.data_ptr(), res.data_ptr(),
    )
    if status != 0:
        raise RuntimeError("the fused CPU selection kernel ran out of memory")
    return res[0], res[1], res[2], res[3], res[4]
