"""Train a small CTC speech recogniser on a speechpipe recipe's loader, end to end.

A Conformer encoder (torchaudio) with a CTC head over a sentencepiece vocabulary trained on the
training transcripts, fed by ``librispeech_train`` + ``build_loader``:

* one process (``python examples/asr/train.py``) or one per device under ``torchrun``
  (gloo on CPU, NCCL on CUDA), every rank taking the same number of steps: the recipe plans
  each epoch's batches over virtual streams (the same global batches for any number of ranks
  and workers), and ``build_loader(..., uneven="plan")`` (:class:`speechpipe.EqualSteps`)
  takes the planned step count, with no collective per step;
* mixed precision on CUDA (bfloat16 where the device has it, else float16 with a gradient
  scaler), gradient accumulation over ``--accum`` batches (DDP's ``no_sync`` between);
* a checkpoint per rank of the model, optimiser, scheduler, scaler, random generator and the
  loader's position: ``--resume`` continues with the very batches and weights an unbroken run
  would have had;
* validation with greedy CTC decoding and the word error rate from ``jiwer``, summed over
  ranks.

It runs on the demo corpus shipped with speechpipe (the default ``--corpus``) on a laptop CPU
in seconds; ``docs/training.md`` shows how to point it at LibriSpeech. Each optimiser step
appends a line to ``<out>/log-rank<r>.jsonl`` (step, loss, learning rate, the keys of the
utterances it trained on), which the tests use to compare runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchaudio

import speechpipe as sp

N_MELS = 80


# --------------------------------------------------------------------------- the model


class CTCConformer(torch.nn.Module):
    """Frame stacking (``subsample`` frames into one, 10 ms -> 40 ms), a Conformer encoder and
    a linear CTC head; ``forward`` gives log-probabilities ``(B, T', vocab)`` and ``T'``."""

    def __init__(self, vocab_size: int, *, d_model: int = 144, heads: int = 4, ffn: int = 576,
                 layers: int = 4, kernel: int = 15, subsample: int = 4,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.subsample = subsample
        self.norm = torch.nn.LayerNorm(N_MELS * subsample)
        self.front = torch.nn.Linear(N_MELS * subsample, d_model)
        self.encoder = torchaudio.models.Conformer(
            input_dim=d_model, num_heads=heads, ffn_dim=ffn, num_layers=layers,
            depthwise_conv_kernel_size=kernel, dropout=dropout)
        self.head = torch.nn.Linear(d_model, vocab_size)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor):
        batch, frames, dim = feats.shape
        pad = (-frames) % self.subsample
        x = F.pad(feats, (0, 0, 0, pad)).reshape(batch, (frames + pad) // self.subsample,
                                                 dim * self.subsample)
        lengths = torch.div(lengths + self.subsample - 1, self.subsample, rounding_mode="floor")
        x, lengths = self.encoder(self.front(self.norm(x)), lengths)
        return self.head(x).float().log_softmax(-1), lengths


def ctc_loss(model: torch.nn.Module, batch: dict, device: torch.device, amp: Any):
    """The batch's CTC loss, summed over utterances and divided by their number."""
    feats = batch["feats"].to(device, non_blocking=True)
    lengths = batch["feats_len"].to(device)
    with amp():
        log_probs, out_lengths = model(feats, lengths)
    tokens = batch["tokens"].to(device).clamp(min=0)  # padded with -1: CTC reads lengths
    loss = F.ctc_loss(log_probs.transpose(0, 1), tokens, out_lengths, batch["tokens_len"].to(device),
                      blank=0, reduction="sum", zero_infinity=True)
    return loss / feats.shape[0]


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor, tokenizer: Any) -> list[str]:
    """Best path: the most likely token per frame, repeats merged, blanks removed."""
    best = log_probs.argmax(-1).cpu()
    texts = []
    for row, length in zip(best, lengths.cpu().tolist()):
        ids = torch.unique_consecutive(row[:length]).tolist()
        texts.append(tokenizer.decode([i for i in ids if i != 0]))
    return texts


# --------------------------------------------------------------------------- processes


def start_processes() -> tuple[int, int, torch.device]:
    """Rank, world size and device: a process group when started by ``torchrun``."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_sum(values: list[float], device: torch.device) -> list[float]:
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


# --------------------------------------------------------------------------- data


def prepare(args: argparse.Namespace, rank: int) -> tuple[Any, Any]:
    """Manifests (written once, by rank 0) and the sentencepiece tokenizer."""
    recipe = sp.get_recipe("librispeech")
    manifest_dir = os.path.join(args.out, "manifests")
    parts = sorted(set(args.train_parts) | set(args.valid_parts))
    if rank == 0:
        recipe.prepare_librispeech(args.corpus, manifest_dir, parts=parts, progress=False)
    barrier()
    manifests = recipe.prepare_librispeech(args.corpus, manifest_dir, parts=parts,
                                           progress=False)
    path = os.path.join(args.out, "tokenizer.model")
    if rank == 0 and not os.path.exists(path):
        texts = (row["text"] for part in args.train_parts
                 for row in sp.recipes.manifest_samples(manifests[part]))
        tokenizer = sp.build_tokenizer("sentencepiece", texts, vocab_size=args.vocab_size,
                                       model_type="unigram", character_coverage=1.0)
        tokenizer.save(path + ".tmp")
        os.replace(path + ".tmp", path)
    barrier()
    return manifests, sp.load_tokenizer(path)


def train_loader(args: argparse.Namespace, manifests: Any, tokenizer: Any,
                 device: torch.device, telemetry: bool = False) -> Any:
    recipe = sp.get_recipe("librispeech")
    pipe = recipe.librispeech_train(
        manifests, parts=args.train_parts, budget=args.budget_seconds,
        max_duration=args.max_duration, seed=args.seed, bucket_buffer=args.bucket_buffer,
        features="fbank", tokenizer=tokenizer)
    options: dict[str, Any] = {}
    if telemetry:
        options["telemetry"] = True
    if args.persistent_workers and args.workers:
        options["persistent_workers"] = True  # no fresh workers at each epoch's start
    return sp.build_loader(pipe, num_workers=args.workers, device=device,
                           pin_memory=device.type == "cuda", seed=args.seed, uneven="plan",
                           snapshot_every=args.checkpoint_every or 100, **options)


def valid_batches(args: argparse.Namespace, manifests: Any, tokenizer: Any) -> Any:
    recipe = sp.get_recipe("librispeech")
    return recipe.librispeech_valid(manifests, parts=args.valid_parts, budget=sp.SampleCount(8),
                                    features="fbank")


def fixed_batches(loader: Iterable, count: int) -> Iterator[dict]:
    """The loader's first ``count`` batches, then the same batches again and again (the
    convergence check trains on a fixed set)."""
    kept = []
    for batch in loader:
        kept.append(batch)
        if len(kept) == count:
            break
    if len(kept) < count:
        raise ValueError(f"--fixed-batches {count}: the loader gave only {len(kept)} batches")
    while True:
        yield from kept


@torch.no_grad()
def validate(model: torch.nn.Module, batches: Iterable[dict], tokenizer: Any,
             device: torch.device, amp: Any) -> dict[str, float]:
    """Greedy decoding and word errors (jiwer), summed over ranks."""
    import jiwer

    model.eval()
    refs: list[str] = []
    hyps: list[str] = []
    for batch in batches:
        with amp():
            log_probs, lengths = model(batch["feats"].to(device), batch["feats_len"].to(device))
        hyps.extend(greedy_decode(log_probs, lengths, tokenizer))
        refs.extend(batch["text"])
    model.train()
    errors = words = 0.0
    if refs:
        out = jiwer.process_words(refs, [h if h.strip() else "" for h in hyps])
        errors = float(out.substitutions + out.deletions + out.insertions)
        words = float(out.substitutions + out.deletions + out.hits)
    errors, words, count = all_sum([errors, words, float(len(refs))], device)
    return {"wer": errors / words if words else math.nan, "utterances": int(count),
            "example": hyps[0] if hyps else ""}


# --------------------------------------------------------------------------- checkpoints


def checkpoint_path(out: str, step: int, rank: int) -> str:
    return os.path.join(out, f"checkpoint-{step}", f"rank{rank}.pt")


def save_checkpoint(path: str, state: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a checkpoint is whole or absent


def latest_checkpoint(out: str, rank: int) -> str | None:
    steps = [int(name.split("-", 1)[1]) for name in os.listdir(out)
             if name.startswith("checkpoint-") and name.split("-", 1)[1].isdigit()
             and os.path.exists(checkpoint_path(out, int(name.split("-", 1)[1]), rank))]
    return checkpoint_path(out, max(steps), rank) if steps else None


# --------------------------------------------------------------------------- the loop


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=sp.DEMO_CORPUS, help="a LibriSpeech folder")
    p.add_argument("--train-parts", nargs="+", default=["dev-clean"])
    p.add_argument("--valid-parts", nargs="+", default=["dev-clean"])
    p.add_argument("--out", default="out/asr", help="manifests, tokenizer, logs, checkpoints")
    p.add_argument("--steps", type=int, default=200, help="optimiser steps in all")
    p.add_argument("--stop-after", type=int, default=None,
                   help="save a checkpoint and exit after this many steps (as a preemption)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: none)")
    p.add_argument("--valid-every", type=int, default=0, help="steps (0: at the end only)")
    p.add_argument("--log-every", type=int, default=10, help="steps between printed lines")
    p.add_argument("--accum", type=int, default=1, help="batches per optimiser step")
    p.add_argument("--budget-seconds", type=float, default=60.0, help="padded audio per batch")
    p.add_argument("--max-duration", type=float, default=20.0)
    p.add_argument("--bucket-buffer", type=int, default=2000)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--persistent-workers", action="store_true",
                   help="keep the workers across epochs (with --workers)")
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument("--d-model", type=int, default=144)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fixed-batches", type=int, default=0,
                   help="train on the loader's first N batches over and over (0: off)")
    p.add_argument("--amp", choices=("auto", "off"), default="auto",
                   help="mixed precision on CUDA (auto) or never")
    p.add_argument("--telemetry", action="store_true", help="print the loader's telemetry")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    args = p.parse_args(argv)
    for name in ("steps", "accum", "vocab_size", "d_model", "layers", "heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def mixed_precision(device: torch.device, mode: str) -> tuple[Any, Any]:
    """The autocast context and the gradient scaler (enabled for float16 only)."""
    if device.type != "cuda" or mode == "off":
        return contextlib.nullcontext, torch.amp.GradScaler("cuda", enabled=False)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return (lambda: torch.autocast("cuda", dtype=dtype),
            torch.amp.GradScaler("cuda", enabled=dtype == torch.float16))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = start_processes()
    os.makedirs(args.out, exist_ok=True)
    try:
        return train(args, rank, world, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# long: the training loop, one screen: accumulation, checkpoint, validation and logs in place
def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> dict:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    manifests, tokenizer = prepare(args, rank)
    loader = train_loader(args, manifests, tokenizer, device, telemetry=args.telemetry)
    net = CTCConformer(tokenizer.vocab_size, d_model=args.d_model, heads=args.heads,
                       ffn=4 * args.d_model, layers=args.layers, dropout=args.dropout).to(device)
    model = torch.nn.parallel.DistributedDataParallel(net) if world > 1 else net
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / args.warmup))
    amp, scaler = mixed_precision(device, args.amp)
    step = 0
    if args.resume:
        path = latest_checkpoint(args.out, rank)
        if path is None:
            raise FileNotFoundError(f"--resume: no checkpoint for rank {rank} in {args.out}")
        # on the CPU: the generator states must stay CPU tensors; load_state_dict moves the
        # weights and the optimiser's moments to the model's device
        state = torch.load(path, map_location="cpu", weights_only=False)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        step = state["step"]
    if rank == 0:
        params = sum(p.numel() for p in net.parameters())
        print(f"model: {params / 1e6:.2f} M parameters, vocabulary {tokenizer.vocab_size}, "
              f"{world} process(es) on {device}, "
              f"{'resuming at step ' + str(step) if step else 'from scratch'}", flush=True)
    log = open(os.path.join(args.out, f"log-rank{rank}.jsonl"), "a", encoding="utf-8")
    losses: list[float] = []
    micro, keys, total = 0, [], 0.0
    stop = args.steps if args.stop_after is None else min(args.steps, args.stop_after)
    start = time.perf_counter()

    def save() -> None:
        save_checkpoint(checkpoint_path(args.out, step, rank), {
            "model": net.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "loader": loader.state_dict(), "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "step": step})

    batches = fixed_batches(loader, args.fixed_batches) if args.fixed_batches else None
    while step < stop:
        for batch in (batches if batches is not None else loader):
            last = micro + 1 == args.accum
            sync = model.no_sync() if world > 1 and not last else contextlib.nullcontext()
            with sync:
                loss = ctc_loss(model, batch, device, amp)
                scaler.scale(loss / args.accum).backward()
            total += float(loss.detach()) / args.accum
            keys.append(list(batch["key"]))
            micro += 1
            if not last:
                continue
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            losses.append(total)
            log.write(json.dumps({"step": step, "loss": total, "keys": keys,
                                  "lr": scheduler.get_last_lr()[0]}) + "\n")
            log.flush()
            if rank == 0 and (step % args.log_every == 0 or step + 1 == stop):
                print(f"step {step:5d}  loss {total:8.3f}  "
                      f"{time.perf_counter() - start:7.1f} s", flush=True)
            step += 1
            micro, keys, total = 0, [], 0.0
            if step == stop or args.checkpoint_every and step % args.checkpoint_every == 0:
                save()  # and at the end: the weights a test compares, a run to extend
            if args.valid_every and step % args.valid_every == 0 and step < stop:
                result = validate(net, valid_batches(args, manifests, tokenizer), tokenizer,
                                  device, amp)
                if rank == 0:
                    print(f"step {step:5d}  WER {result['wer']:.3f}", flush=True)
            if step >= stop:
                break
    log.close()
    summary: dict[str, Any] = {"step": step, "losses": losses,
                               "seconds": time.perf_counter() - start}
    if step >= args.steps:
        summary.update(validate(net, valid_batches(args, manifests, tokenizer), tokenizer,
                                device, amp))
        if rank == 0:
            print(f"valid: WER {summary['wer']:.3f} on {summary['utterances']} utterances "
                  f"(e.g. {summary['example']!r})", flush=True)
    if rank == 0 and args.telemetry and getattr(loader, "telemetry", None) is not None:
        print(loader.telemetry.report(), flush=True)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
