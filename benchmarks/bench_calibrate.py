"""Batch budgets from the GPU's memory against the analytic budget, on the example's model.

On a CUDA device: :func:`speechpipe.calibrate_budget` runs the training step of
``examples/asr/train.py``'s ``CTCConformer`` (forward, CTC loss, backward, AdamW step, in
mixed precision) on the worst batch of each of 4 length buckets (80-dim features at 100
frames a second, lengths drawn from LibriSpeech train-clean-100's range, 1-35 s; tokens at 4
per second) up to 85 % of the device's memory. It prints each bucket's cap, the fitted
Quadratic budget, and the padded audio seconds per step it allows at each bucket's longest
utterance beside the analytic budget (``train_pipeline``'s default, 200 padded seconds),
then checks the calibrated worst batches once more: peak memory of each against the device,
and prints the fitted ``Quadratic`` and ``TwoDimensional`` budgets.
Without CUDA it prints "no CUDA device" and exits 0.

    python -m benchmarks bench_calibrate           # d_model 256, 8 layers
    python -m benchmarks bench_calibrate --tiny    # d_model 64, 2 layers
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import time

import torch

import speechpipe as sp

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                      "asr", "train.py")
FRAMES_PER_SECOND = 100
ANALYTIC_SECONDS = 200.0


def _example():
    spec = importlib.util.spec_from_file_location("asr_train_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks bench_calibrate")
    parser.add_argument("--tiny", action="store_true", help="a small model")
    parser.add_argument("--fraction", type=float, default=0.85)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return
    example = _example()
    device = torch.device("cuda")
    d_model, layers = (64, 2) if args.tiny else (256, 8)
    model = example.CTCConformer(256, d_model=d_model, layers=layers, ffn=4 * d_model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp, scaler = example.mixed_precision(device, "auto")

    def step(n: int, frames: float, tokens: float) -> None:
        frames, tokens = int(frames), max(1, int(tokens))
        batch = {"feats": torch.randn(n, frames, 80), "feats_len": torch.full((n,), frames),
                 "tokens": torch.randint(1, 255, (n, tokens)),
                 "tokens_len": torch.full((n,), tokens)}
        loss = example.ctc_loss(model, batch, device, amp)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    rng = random.Random(0)
    seconds = [rng.uniform(1.0, 35.0) for _ in range(2000)]
    lengths = [(s * FRAMES_PER_SECOND, s * 4) for s in seconds]
    total = torch.cuda.get_device_properties(0).total_memory
    start = time.perf_counter()
    cal = sp.calibrate_budget(step, lengths, num_buckets=4, fraction=args.fraction,
                              max_batch=64 if args.tiny else 4096)
    print(f"{torch.cuda.get_device_name(0)}, {total / 2**30:.1f} GiB; limit "
          f"{cal.limit / 2**30:.1f} GiB; {len(cal.measurements)} steps in "
          f"{time.perf_counter() - start:.1f} s")
    print(f"{'bucket longest s':>16} {'cap':>6} {'padded s/step':>14} {'analytic':>9} "
          f"{'ratio':>6} {'peak GiB':>9}")
    for (top, out), cap in zip(cal.buckets, cal.caps):
        top_s = top / FRAMES_PER_SECOND
        analytic = int(ANALYTIC_SECONDS // top_s) * top_s
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            step(max(cap, 1), top, out)
            peak = torch.cuda.max_memory_allocated() / 2**30
        except torch.cuda.OutOfMemoryError:  # a cap of 0 (not even one fits) tried with 1
            peak = float("inf")
            torch.cuda.empty_cache()
        print(f"{top_s:>16.1f} {cap:>6} {cap * top_s:>14.0f} {analytic:>9.0f} "
              f"{cap * top_s / analytic if analytic else float('nan'):>6.2f} {peak:>9.2f}")
    try:
        quadratic = cal.quadratic()
        print(f"fitted Quadratic(budget={quadratic.budget:.0f} frames, q={quadratic.q:.0f})")
    except ValueError as exc:
        print(f"no Quadratic fit: {exc}")
    try:
        two = cal.two_dimensional()
        print(f"fitted TwoDimensional(budget_in={two.budget_in:.0f} frames, "
              f"budget_out={two.budget_out:.0f} tokens)")
    except ValueError as exc:
        print(f"no TwoDimensional fit: {exc}")


if __name__ == "__main__":
    main()
