"""Bulk shortest round-trip formatting of 32-bit floats, as ``str(numpy.float32(x))`` prints
them, into a fixed-width byte matrix (one row per value, padded with ``0xFF``).

``str(np.float32(x))`` prints the shortest decimal that reads back as the same float32 and,
among the shortest, the one closest to x (Steele & White 1990, "How to print floating-point
numbers accurately"; numpy's Dragon4). Calling it once per value costs about 0.3-2 µs, which
made the ARPA writer spend most of its time here. This module finds the same digits for a
whole array with a few float64 array operations:

* the round-trip interval of a float32 x (not a power of two) is (x - h, x + h), h half the
  gap to its neighbours; both ends are exact float64 numbers;
* for p significant digits, the two p-digit decimals around x are floor(x / 10^q) * 10^q and
  the next one, q = e10 - p + 1; each is computed as one correctly rounded float64 operation
  on exact operands (an integer below 2^53 and a power of ten below 10^22);
* the shortest p is the smallest for which one of them lies inside the interval (if p works,
  so does p + 1, so a short search from p = 8 suffices); if both do, the closer wins.

Whenever float64 cannot decide exactly (a candidate on an interval end, a near tie between
the two candidates), and for values outside 1e-3 <= |x| < 99.5, powers of two, zeros, NaN and
infinities, the value goes through numpy's own formatter instead, so the result is always
``str(np.float32(x))`` byte for byte (tested on random bit patterns).

Shape legend: n = values; the result is (n, WIDTH) uint8, ASCII, right-padded with ``PAD``.
"""

from __future__ import annotations

import numpy as np

PAD = 0xFF  # never a byte of UTF-8 text, so padding can be squeezed out of any row
WIDTH = 15
_DOT_COL = 3  # sign and up to 2 integer digits before the point
_FRAC = WIDTH - _DOT_COL - 1  # fraction digits at most (11 = 9 digits + 2 leading zeros)
_ZERO, _DOT, _MINUS = ord("0"), ord("."), ord("-")
_POW10 = 10.0 ** np.arange(0, 23)
_POW10I = 10 ** np.arange(0, 19, dtype=np.int64)


def _slow(x: np.ndarray) -> np.ndarray:
    """numpy's formatter, one value at a time (in C), as a padded byte matrix."""
    if len(x) == 0:
        return np.full((0, WIDTH), PAD, dtype=np.uint8)
    s = x.astype(np.dtypes.StringDType()).astype(f"S{WIDTH}")
    out = s.view(np.uint8).reshape(len(x), WIDTH).copy()
    out[out == 0] = PAD
    return out


# 10^q = _MUL[q + 22] / _DIV[q + 22], both exact float64 integers, one of them 1
_MUL = np.concatenate([np.ones(22), _POW10])
_DIV = np.concatenate([_POW10[:0:-1], np.ones(23)])


def _value(m: np.ndarray, q: np.ndarray) -> np.ndarray:
    """m * 10^q, correctly rounded (integer m < 2^53, |q| <= 22): one inexact operation."""
    return m * _MUL[q + 22] / _DIV[q + 22]


def _shortest(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shortest digits of each float32 ``a`` (positive, float64 exact copies): (m, q, ok) with
    a's repr = m * 10^q; ``ok`` False where float64 could not decide exactly."""
    n = len(a)
    h = np.spacing(a.astype(np.float32)).astype(np.float64) / 2
    lo, hi = a - h, a + h
    e10 = np.floor(np.log10(a)).astype(np.int64)
    one = np.ones(n)
    e10 -= a < _value(one, e10)  # log10 rounding near powers of ten
    e10 += a >= _value(one, e10 + 1)
    m = np.zeros(n, dtype=np.int64)
    q = np.zeros(n, dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    found = np.zeros(n, dtype=bool)  # digits known (at the p that made them shortest)
    p = np.full(n, 8, dtype=np.int64)  # the usual length; then one digit down or up per pass
    todo = np.arange(n)
    while len(todo):
        pp, aa, lo_t, hi_t = p[todo], a[todo], lo[todo], hi[todo]
        qq = e10[todo] - pp + 1
        mul, div = _MUL[qq + 22], _DIV[qq + 22]
        m0 = np.floor(aa * div / mul)  # one rounding: one factor is 1
        c0, c1 = m0 * mul / div, (m0 + 1) * mul / div
        edge = (c0 == lo_t) | (c0 == hi_t) | (c1 == lo_t) | (c1 == hi_t)
        in0 = (c0 > lo_t) & (c0 < hi_t)
        in1 = (c1 > lo_t) & (c1 < hi_t)
        d0, d1 = aa - c0, c1 - aa
        bad = edge | (in0 & in1 & (np.abs(d0 - d1) <= 4 * np.spacing(aa)))  # a near tie
        ok[todo[bad]] = False
        works = (in0 | in1) & ~bad
        w = todo[works]
        m[w] = (m0 + (in1 & (~in0 | (d1 < d0))))[works].astype(np.int64)
        q[w] = qq[works]
        was_found = found[todo]
        found[w] = True
        # works: try one digit fewer; fails: one more if nothing shorter worked (9 always does)
        nxt = np.where(works, pp - 1, pp + 1)
        again = ~bad & (nxt >= 1) & (nxt <= 9) & (works | ~was_found)
        p[todo] = nxt
        todo = todo[again]
    ok &= found
    return m, q, ok


def _digits_matrix(m: np.ndarray, q: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Positional text (numpy style: '12.5', '3.0', '0.0125') of m * 10^q (|value| < 100) in a
    fixed layout: sign and integer digits right-aligned before column ``_DOT_COL``, the point,
    the fraction digits left-aligned after it; unused columns are ``PAD`` (squeezed out later).
    """
    n = len(m)
    zeros = (m % 10 == 0) & (m > 0)
    while zeros.any():  # drop trailing zeros of the digits
        m = np.where(zeros, m // 10, m)
        q = np.where(zeros, q + 1, q)
        zeros = (m % 10 == 0) & (m > 0)
    fl = np.maximum(-q, 1)  # fraction digits ('.0' for integers)
    neg_q = np.maximum(-q, 0)
    scale = _POW10I[neg_q]
    ipart = np.where(q >= 0, m * _POW10I[np.maximum(q, 0)], m // scale)
    frac = np.where(q >= 0, 0, m % scale) * _POW10I[_FRAC - fl]  # left-aligned, _FRAC digits
    out = np.full((n, WIDTH), PAD, dtype=np.uint8)
    n_int = np.ones(n, dtype=np.int64)
    for j in range(1, _DOT_COL - 1):  # digits of the integer part
        n_int += ipart >= 10**j
    for c in range(_DOT_COL):
        j = _DOT_COL - 1 - c  # power of ten of this column
        digit = (ipart // 10**j) % 10 + _ZERO
        col = np.where(j < n_int, digit, PAD)
        out[:, c] = np.where(neg & (j == n_int), _MINUS, col)
    out[:, _DOT_COL] = _DOT
    for i in range(_FRAC):
        digit = (frac // 10 ** (_FRAC - 1 - i)) % 10 + _ZERO
        out[:, _DOT_COL + 1 + i] = np.where(i < fl, digit, PAD)
    return out


def format_float32(x: np.ndarray) -> np.ndarray:
    """(n, WIDTH) uint8: row i is ``str(np.float32(x[i]))`` in ASCII, padded with ``PAD``."""
    x = np.asarray(x, dtype=np.float32).ravel()
    a = np.abs(x).astype(np.float64)
    frac_bits = x.view(np.uint32) & np.uint32(0x7FFFFF)
    fast = np.isfinite(a) & (a >= 1e-3) & (a < 99.5) & (frac_bits != 0)
    out = np.empty((len(x), WIDTH), dtype=np.uint8)
    idx = np.flatnonzero(fast)
    m, q, ok = _shortest(a[idx])
    good = idx[ok]
    out[good] = _digits_matrix(m[ok], q[ok], x[good] < 0)
    rest = np.flatnonzero(~fast)
    rest = np.concatenate([rest, idx[~ok]])
    out[rest] = _slow(x[rest])
    return out
