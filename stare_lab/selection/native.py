"""A fused CPU kernel for the STARE selection (docs/theory.md §4), compiled on first use.

The tensor implementation in :mod:`stare_lab.selection.radix` is exact, linear-time and free of host synchronisation, which is
what an accelerator needs; on a CPU it still runs about sixteen separate tensor operations over the batch. This module
does the same selection in three tight C loops over the batch (key + histogram of the high 16 bits; histogram of the
low 15 bits inside the threshold bin; one row-major write that takes the ties in order), with the same keys, the same
k and the same tie rule, so its result is identical bit for bit (the tests compare the two and an independent sort).
There is no device to synchronise with on a CPU; the kernel reads no value back into Python.

The C source below is compiled with the system C compiler (``$CC``, split like a shell word list; default ``cc``) into a shared library cached under
``$STARE_LAB_CACHE_DIR`` (default ``~/.cache/stare_lab``, or the temp directory if that is not writable) and loaded
with :mod:`ctypes`; building takes well under a second and happens once per source version. Without a working
compiler :func:`available` is False and :mod:`stare_lab.selection.radix` uses the tensor implementation (one warning is logged).
``STARE_LAB_NATIVE=0`` disables the kernel (another value than 0/1, on/off, true/false, yes/no is an error).
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

from stare_lab.selection import native_enabled

logger = logging.getLogger(__name__)

__all__ = ["available", "select_into", "select_by_advantage", "load_error"]

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

/* valid[i] != 0 for the mask's dtype: 0 uint8/bool, 1 float32, 2 int32, 3 int64 (a float 0/1 mask is read as it
   is, never converted first) */
static inline int is_valid(const void *valid, int kind, int64_t i)
{
    switch (kind) {
    case 1: return ((const float *)valid)[i] != 0.0f;
    case 2: return ((const int32_t *)valid)[i] != 0;
    case 3: return ((const int64_t *)valid)[i] != 0;
    default: return ((const uint8_t *)valid)[i] != 0;
    }
}

/* The set of a token: sel_kind 0 reads set ids (uint8: 1 set 1, 2 set 2, else none); sel_kind 1 reads float32
   advantages (set 1 if > 0; set 2 if < 0 and two_sets; none otherwise, NaN included). */
static inline int set_of(const void *sel, int sel_kind, int two_sets, int64_t i)
{
    if (sel_kind == 1) {
        const float a = ((const float *)sel)[i];
        return a > 0.0f ? 1 : (two_sets && a < 0.0f ? 2 : 0);
    }
    const uint8_t s = ((const uint8_t *)sel)[i];
    return (s == 1 || (s == 2 && two_sets)) ? s : 0;
}

/* Whether per-token advantages are constant along each row over its valid tokens (GRPO's advantages in verl's
   [B, T] layout, zero on padding); if so, row_adv[r] gets that value (0 for a row without a valid token). Stops at
   the first row that differs, which for per-token advantages comes within a few tokens. */
static int rows_constant(const float *adv, const void *valid, int valid_kind, int64_t rows, int64_t cols,
                         float *row_adv)
{
    for (int64_t r = 0; r < rows; ++r) {
        const float *a = adv + r * cols;
        int64_t c = 0;
        while (c < cols && !is_valid(valid, valid_kind, r * cols + c)) ++c;
        const float a0 = c < cols ? a[c] : 0.0f;
        if (a0 != a0) return 0; /* NaN: per token */
        for (; c < cols; ++c)
            if (a[c] != a0 && is_valid(valid, valid_kind, r * cols + c)) return 0;
        row_adv[r] = a0;
    }
    return 1;
}

/* Two disjoint sets at once (set 1 = L+, set 2 = L-): for each set s, exactly k_s = num_selected(n_s) of its
   candidates with the largest key, key = bits of |log p| (a non-negative float32 orders like its bit pattern),
   ties in row-major order. Candidates of set s: valid tokens whose set (set_of, per row when !sel_per_token: one
   value per row, advantages constant along it) is s. Pass 1 stores in `out` the key of a candidate and -1 for any
   other token; with sets per token, a set-2 candidate's key is stored as -2 - key (<= -2), so that the later
   passes never read the mask or the sets again (with sets per row they read the row's set).
   out[i] = on1 / on2 on the selected tokens of set 1 / 2, off elsewhere.
   res = {k1, n1, k2, n2, number of valid tokens}. Returns 0, or 1 if out of memory. */
int stare_select(const float *lp, const void *valid, int valid_kind, const void *sel, int sel_kind,
                 int sel_per_token, int two_sets, int64_t rows, int64_t cols, double p_scaled, int32_t on1,
                 int32_t on2, int32_t off, int32_t *out, int64_t *res)
{
    uint32_t *hist1 = (uint32_t *)calloc(2 * 65536, sizeof(uint32_t));
    uint32_t *hist2 = (uint32_t *)calloc(2 * 32768, sizeof(uint32_t));
    float *row_adv = sel_kind == 1 && sel_per_token ? (float *)malloc((size_t)(rows > 0 ? rows : 1) * sizeof(float))
                                                    : NULL;
    if (!hist1 || !hist2 || (sel_kind == 1 && sel_per_token && !row_adv)) {
        free(hist1); free(hist2); free(row_adv); return 1;
    }
    if (row_adv && rows_constant((const float *)sel, valid, valid_kind, rows, cols, row_adv)) {
        sel = row_adv; /* advantages constant along each row: the per-row passes */
        sel_per_token = 0;
    }
    int64_t n[2] = {0, 0}, num_valid = 0;
    /* pass 1: keys and, per set, the histogram of their high 16 bits */
    for (int64_t r = 0; r < rows; ++r) {
        const float *lp_r = lp + r * cols;
        int32_t *out_r = out + r * cols;
        const int row_set = sel_per_token ? -1 : set_of(sel, sel_kind, two_sets, r);
        if (row_set == 0) {
            for (int64_t c = 0; c < cols; ++c) {
                num_valid += is_valid(valid, valid_kind, r * cols + c);
                out_r[c] = -1;
            }
            continue;
        }
        if (row_set > 0) {
            uint32_t *h = hist1 + (row_set - 1) * 65536;
            int64_t count = 0;
/* one loop per mask dtype, so that the inner loop has no dtype switch */
#define ROW_KEYS(TYPE, ZERO)                                                   \
            {                                                                  \
                const TYPE *valid_r = (const TYPE *)valid + r * cols;          \
                for (int64_t c = 0; c < cols; ++c) {                           \
                    uint32_t bits;                                             \
                    memcpy(&bits, lp_r + c, sizeof bits);                      \
                    if (valid_r[c] != ZERO) {                                  \
                        bits &= 0x7FFFFFFFu;                                   \
                        out_r[c] = (int32_t)bits;                              \
                        h[bits >> 15] += 1;                                    \
                        count += 1;                                            \
                    } else {                                                   \
                        out_r[c] = -1;                                         \
                    }                                                          \
                }                                                              \
            }
            switch (valid_kind) {
            case 1: ROW_KEYS(float, 0.0f) break;
            case 2: ROW_KEYS(int32_t, 0) break;
            case 3: ROW_KEYS(int64_t, 0) break;
            default: ROW_KEYS(uint8_t, 0) break;
            }
#undef ROW_KEYS
            n[row_set - 1] += count;
            num_valid += count;
            continue;
        }
        for (int64_t c = 0; c < cols; ++c) {
            const int64_t i = r * cols + c;
            const int v = is_valid(valid, valid_kind, i);
            const int s = set_of(sel, sel_kind, two_sets, i);
            uint32_t bits;
            memcpy(&bits, lp_r + c, sizeof bits);
            bits &= 0x7FFFFFFFu;
            num_valid += v;
            if (v && s) {
                if (s == 2 && bits == 0x7FFFFFFFu) bits = 0x7FFFFFFEu; /* the one NaN pattern -2 - key cannot hold */
                out_r[c] = s == 1 ? (int32_t)bits : -2 - (int32_t)bits;
                hist1[(s - 1) * 65536 + (bits >> 15)] += 1;
                n[s - 1] += 1;
            } else {
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
    /* pass 2: per set, the low 15 bits of the keys inside its threshold bin (key -1 >> 15 is -1: never a bin) */
    const int64_t total = rows * cols;
    if (sel_per_token) {
        for (int64_t i = 0; i < total; ++i) {
            const int32_t code = out[i];
            if (code >= 0) {
                if ((code >> 15) == b1[0]) hist2[code & 0x7FFF] += 1;
            } else if (code <= -2) {
                const int32_t key = -2 - code;
                if ((key >> 15) == b1[1]) hist2[32768 + (key & 0x7FFF)] += 1;
            }
        }
    } else {
        for (int64_t r = 0; r < rows; ++r) {
            const int s = set_of(sel, sel_kind, two_sets, r) - 1;
            if (s < 0) continue;
            const int32_t *out_r = out + r * cols;
            const int32_t bin = b1[s];
            uint32_t *h = hist2 + s * 32768;
            for (int64_t c = 0; c < cols; ++c) {
                const int32_t key = out_r[c];
                if ((key >> 15) == bin) h[key & 0x7FFF] += 1;
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
    if (sel_per_token) {
        for (int64_t i = 0; i < total; ++i) {
            const int32_t code = out[i];
            int32_t value = off;
            if (code >= 0) {
                if (code > t[0] || (code == t[0] && taken[0]++ < need[0])) value = on1;
            } else if (code <= -2) {
                const int32_t key = -2 - code;
                if (key > t[1] || (key == t[1] && taken[1]++ < need[1])) value = on2;
            }
            out[i] = value;
        }
    } else {
        for (int64_t r = 0; r < rows; ++r) {
            const int s = set_of(sel, sel_kind, two_sets, r) - 1;
            int32_t *out_r = out + r * cols;
            if (s < 0) {
                for (int64_t c = 0; c < cols; ++c) out_r[c] = off;
                continue;
            }
            const int32_t ts = t[s], on = s == 0 ? on1 : on2;
            for (int64_t c = 0; c < cols; ++c) {
                const int32_t key = out_r[c];
                int32_t value = key > ts ? on : off;
                if (key == ts && taken[s] < need[s]) { value = on; taken[s] += 1; }
                out_r[c] = value;
            }
        }
    }
    free(hist1);
    free(hist2);
    free(row_adv);
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
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
        ctypes.c_void_p, ctypes.c_void_p,
    ]
    return lib


def available() -> bool:
    """Whether the kernel is enabled (``STARE_LAB_NATIVE`` is not ``0``: :func:`stare_lab.selection.native_enabled`,
    which raises ConfigError for a value that is neither) and built; builds it on the first call."""
    global _lib, _error, _tried
    if not native_enabled():
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


#: the kernel's code of each mask dtype (``is_valid``); other dtypes are compared with 0 first
_VALID_KINDS = {torch.bool: 0, torch.uint8: 0, torch.float32: 1, torch.int32: 2, torch.int64: 3}


def _valid_arg(valid: Tensor, rows: int, cols: int) -> tuple[Tensor, int]:
    """``valid`` as a contiguous ``[rows, cols]`` tensor the kernel reads as it is (bool/uint8, float32, int32,
    int64: no conversion pass), and its kind code."""
    kind = _VALID_KINDS.get(valid.dtype)
    if kind is None:
        valid, kind = valid != 0, 0
    valid = valid.reshape(rows, cols).contiguous()
    return (valid.view(torch.uint8) if valid.dtype == torch.bool else valid), kind


def select_into(
    lp2: Tensor, valid: Tensor, set_id: Tensor, p_scaled: float, out: Tensor, on1: int, on2: int, off: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Run the kernel for up to two disjoint sets given as set ids: ``out`` (int32 ``[rows, cols]``, contiguous
    CPU) gets ``on1`` / ``on2`` on the selected tokens of set 1 / set 2 and ``off`` elsewhere.

    Args:
        lp2: float32 ``[rows, cols]`` log-probabilities (CPU; made contiguous here).
        valid: ``[rows, cols]`` mask, bool or 0/1 of any dtype (bool, uint8, float32, int32, int64 are read as
            they are).
        set_id: uint8 ``[rows, 1]`` (per row) or ``[rows, cols]``: 1 for set 1 (e.g. Â > 0), 2 for set 2 (Â < 0),
            0 for neither.
        p_scaled: P·(1 − 1e-12), the factor of n before the ceiling (see ``radix_select.num_selected``).

    Returns:
        ``(k1, n1, k2, n2, num_valid)`` as int64 0-dim tensors.

    Raises:
        RuntimeError: if the kernel is not available, ``out`` is not a contiguous int32 tensor of the right shape,
            or the kernel runs out of memory.
    """
    rows = lp2.shape[0]
    per_token = set_id.shape == lp2.shape
    sel = set_id.reshape(rows, -1).to(torch.uint8).contiguous()
    return _run(lp2, valid, sel, 0, per_token, True, p_scaled, out, on1, on2, off)


def select_by_advantage(
    lp2: Tensor, valid: Tensor, advantages: Tensor, two_sets: bool, p_scaled: float, out: Tensor, on1: int, on2: int,
    off: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`select_into` with the sets read from the advantages inside the kernel: set 1 = Â > 0, set 2 = Â < 0
    (only when ``two_sets``), so neither the sets nor a bool mask are built first.

    Args:
        advantages: ``[rows]`` / ``[rows, 1]`` (one per row) or ``[rows, cols]`` (per token, e.g. verl's layout); a
            ``[rows, cols]`` view that is constant along each row by construction (stride 0, e.g. ``adv[:, None]
            .expand(...)``) is read once per row. Read as float32 (converted only when of another dtype).

    Returns / Raises: as :func:`select_into`.
    """
    rows, cols = lp2.shape
    adv = advantages.detach()
    if adv.dim() == 2 and adv.shape[1] != 1 and adv.stride(1) == 0:
        adv = adv[:, 0]  # constant along each row: one value per row
    per_token = adv.dim() == 2 and adv.shape[1] == cols and cols != 1
    adv = adv.reshape(rows, cols if per_token else 1).to(torch.float32).contiguous()
    return _run(lp2, valid, adv, 1, per_token, two_sets, p_scaled, out, on1, on2, off)


def _run(lp2: Tensor, valid: Tensor, sel: Tensor, sel_kind: int, per_token: bool, two_sets: bool, p_scaled: float,
         out: Tensor, on1: int, on2: int, off: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    if not available():
        raise RuntimeError(f"the fused CPU selection kernel is not available: {_error}")
    rows, cols = lp2.shape
    if not (out.is_contiguous() and out.dtype == torch.int32 and out.shape == lp2.shape):
        raise RuntimeError("out must be a contiguous int32 tensor of the shape of the log-probabilities")
    lp_c = lp2.contiguous()
    valid_c, valid_kind = _valid_arg(valid, rows, cols)
    res = torch.zeros(5, dtype=torch.int64)
    status = _lib.stare_select(  # type: ignore[union-attr]
        lp_c.data_ptr(), valid_c.data_ptr(), valid_kind, sel.data_ptr(), sel_kind, int(per_token), int(two_sets),
        rows, cols, float(p_scaled), int(on1), int(on2), int(off), out.data_ptr(), res.data_ptr(),
    )
    if status != 0:
        raise RuntimeError("the fused CPU selection kernel ran out of memory")
    return res[0], res[1], res[2], res[3], res[4]
