"""Grading throughput of trainer.grading.rewards on realistic responses (target: >= 200 responses/s on one core).

Run: ``python tests/benchmarks/bench_grading.py [--data-dir DIR] [--repeats 1]``. Prints PASS/FAIL.

Responses: ~300 words of reasoning ending in ``\\boxed{answer}`` for every record of the six benchmarks
(trainer/assets/benchmarks): one boxing the gold answer re-written (numbers in canonical form, so the string fast
path does not apply: ``025`` → ``25``) and one boxing a wrong answer (numbers: gold + 1; other answers: first digit
bumped), i.e. half right, half wrong — the mix an RL batch sees. Reported: responses/s overall (the PASS/FAIL
number), per benchmark, and for numeric vs symbolic (math-verify) answers; p50/p99 per-response latency — twice:
``cold`` (every gold parsed on first use) and ``warm-gold`` (golds parsed beforehand, the setting of evaluation
with k ≥ 4 and RL with n = 8 samples per problem; PASS/FAIL uses this one). Every prediction is new in both
(caches of predictions cleared). PASS/FAIL uses responses per CPU-second (grading is single-threaded, so this is
the rate of one idle core); the wall-clock rate is printed too and equals it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from fractions import Fraction

from trainer.evaluation.benchmarks import BENCHMARKS, default_data_dir, load_benchmark
from trainer.grading import rewards
from trainer.grading.rewards import grade_response, normalize_gold, parse_number

TARGET = 200.0

WORDS = ("we compute the sum of the terms and simplify the expression using the identity so that the value "
         "follows from substituting back into the original equation which confirms the result").split()


def reasoning(rng: random.Random, n_words: int = 300) -> str:
    parts = []
    for i in range(n_words):
        parts.append(rng.choice(WORDS))
        if i % 25 == 24:
            parts.append(f"$x_{{{i}}} = {rng.randint(1, 999)} + \\frac{{{rng.randint(1, 9)}}}{{{rng.randint(2, 9)}}}$.")
    return " ".join(parts)


def fmt(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.15g}"
    if "e" in text:
        mant, exp = text.split("e")
        return f"{mant} \\times 10^{{{int(exp)}}}"
    return text if Fraction(text) == value else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def build_items(data_dir, rng):
    items = []
    for bench in BENCHMARKS:
        for p in load_benchmark(bench, data_dir):
            gold = normalize_gold(p.answer, bench)
            num = parse_number(gold)
            if num is not None:
                right, wrong = fmt(num[0]), fmt(num[0] + 1)  # numbers are exact (math-verify's rules) everywhere
            else:
                m = re.search(r"\d", gold)
                right = gold
                wrong = gold[: m.start()] + str((int(m.group(0)) + 1) % 10) + gold[m.end():] if m else gold + "+1"
            for ans, ok in ((right, True), (wrong, False)):
                resp = reasoning(rng) + f"\n\nTherefore, the final answer is $\\boxed{{{ans}}}$."
                items.append((bench, "numeric" if num is not None else "symbolic", resp, p.answer, ok))
    return items


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    data_dir = args.data_dir or default_data_dir()
    if data_dir is None:
        print("FAIL: no benchmark data (set STARE_LAB_BENCHMARK_DIR)")
        return 1
    print(f"load: {os.getloadavg()} (1/5/15 min), cpus {os.cpu_count()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    rng = random.Random(0)
    items = build_items(data_dir, rng)
    words = statistics.mean(len(i[2].split()) for i in items)
    print(f"{len(items)} responses, mean {words:.0f} words")
    grade_response(items[0][2], items[0][3], items[0][0])  # warm-up: imports, ANTLR parser
    results = {}
    for mode in ("cold", "warm-gold"):
        rewards._answers_equal.cache_clear()
        rewards._mv_parse.cache_clear()
        if mode == "warm-gold":  # every gold already parsed, as when grading k >= 4 samples per problem
            for bench, _, _, gold, _ in items:
                rewards._mv_parse(normalize_gold(gold, bench))
        lat, by_bench, by_kind, wrong_verdicts = [], {}, {}, 0
        cpu0 = time.process_time()
        for _ in range(args.repeats):
            for bench, kind, resp, gold, ok in items:
                t = time.perf_counter()
                r = grade_response(resp, gold, bench)
                dt = time.perf_counter() - t
                lat.append(dt)
                by_bench.setdefault(bench, []).append(dt)
                by_kind.setdefault(kind, []).append(dt)
                wrong_verdicts += int(r.correct != ok)
        cpu = time.process_time() - cpu0
        rate = len(lat) / sum(lat)
        print(f"[{mode}] {rate:.1f} responses/s overall (wall clock); {len(lat) / cpu:.1f} responses per CPU-second")
        for name, d in list(by_bench.items()) + list(by_kind.items()):
            print(f"  {name:14s} {len(d):5d} responses  {len(d) / sum(d):8.1f} /s  "
                  f"mean {1000 * statistics.mean(d):7.2f} ms")
        lat.sort()
        print(f"  p50 {1000 * lat[len(lat) // 2]:.2f} ms  p99 {1000 * lat[int(0.99 * len(lat))]:.2f} ms  "
              f"max {1000 * lat[-1]:.0f} ms  verdict errors {wrong_verdicts}")
        results[mode] = (rate, len(lat) / cpu, wrong_verdicts)
    print(f"load after: {os.getloadavg()}")
    rate, cpu_rate, wrong_verdicts = results["warm-gold"]
    # grading is single-threaded pure Python: responses per CPU-second is what one idle core delivers; the
    # wall-clock rate equals it on an idle machine and is lower when other processes share the cores.
    verdict = "PASS" if cpu_rate >= TARGET and wrong_verdicts == 0 else "FAIL"
    print(f"{verdict}: {cpu_rate:.1f} responses per CPU-second with golds parsed (target >= {TARGET:.0f}/s; "
          f"wall clock {rate:.1f}/s at load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores), "
          f"{wrong_verdicts} verdict errors")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
