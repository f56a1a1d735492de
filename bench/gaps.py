#!/usr/bin/env python3
"""Reads stamp files and prints restart latency statistics (microseconds).
usage: gaps.py NAME FILE [NAME FILE ...]; the first one is the baseline for ratios."""
import statistics
import sys


def gaps(path):
    rows = [tuple(map(int, l.split())) for l in open(path) if len(l.split()) == 2]
    rows.sort()
    # Skip the first few (warm-up) restarts.
    return [(b[0] - a[1]) / 1000 for a, b in zip(rows[10:], rows[11:])]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


args = sys.argv[1:]
base = None
print(f"{'supervisor':<22}{'restarts':>9}{'median us':>11}{'p90 us':>9}{'p99 us':>9}{'x bare':>8}")
for name, path in zip(args[::2], args[1::2]):
    g = gaps(path)
    if not g:
        print(f"{name:<22}  (no data)")
        continue
    med = statistics.median(g)
    if base is None:
        base = med
    print(f"{name:<22}{len(g):>9}{med:>11.0f}{pct(g, 0.9):>9.0f}{pct(g, 0.99):>9.0f}{med / base:>8.2f}")
