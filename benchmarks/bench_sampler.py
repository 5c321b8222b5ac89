"""Cost of one sampling draw (``ida_eval.generate.sample_tokens``): the candidates path vs sorting every row.

With ``top_p < 1`` each row first sorts its ``NUCLEUS_CANDIDATES`` most probable tokens and falls back to
sorting its whole vocabulary only when they do not hold its nucleus. Baseline, in the same run: the same
function with ``candidates=0`` (every row sorted whole, what it did before), on the same scores. Printed per
shape and temperature: milliseconds per draw for each (best of ``--repeats``), the ratio, the share of rows
whose nucleus the candidates held, and whether the tokens drawn are identical (they must be: exit 1 if not).

Rows are Zipf-like (logit = -alpha * log(rank), rank a random permutation of the vocabulary), alpha drawn per
row from ``--alphas``: a few likely tokens and a long tail, as a language model's next-token distribution; the
share held depends on it, so it is printed. With ``top_p = 1`` there is nothing to prune: both paths sort.

Usage::

    python benchmarks/bench_sampler.py                       # CPU: batch 64, vocabularies 32000 and 151936
    python benchmarks/bench_sampler.py --device cuda --vocab 32000 151936 256000
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import torch

from ida_common.cli import error_line
from ida_eval.generate import NUCLEUS_CANDIDATES, sample_tokens


def zipf_scores(batch: int, vocab: int, alphas: list[float], seed: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ranks = torch.argsort(torch.rand(batch, vocab, generator=g), dim=1).double() + 1
    alpha = torch.tensor(alphas, dtype=torch.float64)[torch.randint(len(alphas), (batch, 1), generator=g)]
    return (-alpha * ranks.log()).float().to(device)


def best_ms(fn, repeats: int, device: str) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def held_share(scores: torch.Tensor, temperature: float, top_p: float) -> float:
    """Rows whose nucleus lies among their NUCLEUS_CANDIDATES most probable tokens (ties ignored here)."""
    probs = torch.softmax(scores.float() / temperature, dim=-1)
    top = torch.topk(probs, NUCLEUS_CANDIDATES, dim=-1).values.double().sum(dim=-1)
    return float((top >= top_p).double().mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.2, 0.8])
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.8, 1.0, 1.2, 1.5, 2.0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(error_line("bench_sampler", "--device cuda: no CUDA device here"), file=sys.stderr)
        return 3
    print(
        f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
        f"top_p {args.top_p}, {NUCLEUS_CANDIDATES} candidates, Zipf alphas {args.alphas}"
    )
    print("| vocab | T | whole rows sorted ms | candidates ms | ratio | rows held | same tokens |")
    print("|---|---|---|---|---|---|---|")
    all_same = True
    for vocab in args.vocab:
        scores = zipf_scores(args.batch, vocab, args.alphas, seed=vocab, device=args.device)
        u = torch.rand(args.batch, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(args.device)
        for t in args.temperatures:
            full = sample_tokens(scores, u, t, args.top_p, candidates=0)
            fast = sample_tokens(scores, u, t, args.top_p)
            same = bool(torch.equal(full, fast))
            all_same &= same
            draw = functools.partial(sample_tokens, scores, u, t, args.top_p)
            ms_full = best_ms(functools.partial(draw, candidates=0), args.repeats, args.device)
            ms_fast = best_ms(draw, args.repeats, args.device)
            print(
                f"| {vocab} | {t} | {ms_full:.1f} | {ms_fast:.1f} | {ms_fast / ms_full:.2f}x "
                f"| {held_share(scores, t, args.top_p):.0%} | {'yes' if same else 'NO'} |"
            )
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
