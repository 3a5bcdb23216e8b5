"""Audio codecs: decode speed (× real time, one core) and round-trip fidelity, per format.

For each codec soundfile writes and speechpipe reads (WAV 16/24-bit and float, FLAC 16/24-bit,
Ogg/Vorbis, Ogg/Opus, MP3), the demo corpus's speech (espeak, 16 kHz, resampled with
torchaudio to each rate; :func:`speechpipe.testing.demo_speech`) is encoded once with
:func:`speechpipe.encode_audio` and decoded with :func:`speechpipe.pipes.decode._decode.read_audio`, the
one decoder behind ``load_audio``, ``decode`` (tar shards) and ``load_scp("wav")``.

Method: one thread; the codecs take turns within each round in a shuffled order (so that a
slow spell of the machine falls on all of them), each timed by the CPU time of the thread
(``time.thread_time``) over one decode of the whole utterance; the median of the rounds and
the range (fastest, slowest round) are printed as seconds of audio per second of CPU.
Fidelity: ``exact`` when the decoded float32 audio equals the input on the codec's integer
grid (integer PCM) or bit for bit (float WAV), else the waveform SNR in dB and the
correlation against the input; the decoded length against the input's (libsndfile removes
encoder delay and padding). No figure is asserted: ``tests/decode/test_codecs.py`` asserts the bounds.

    python -m benchmarks bench_codecs          # 16 and 48 kHz, 4 demo utterances, 15 rounds
    python -m benchmarks bench_codecs --tiny   # 16 kHz, 1 utterance, 3 rounds
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch

from speechpipe import encode_audio
from speechpipe.pipes.decode import OPUS_RATES
from speechpipe.pipes.decode import read_audio
from speechpipe.testing import demo_speech, on_pcm_grid, snr_db

#: (label, codec, subtype) in the order of the table.
ROWS = [
    ("WAV 16-bit", "wav", "PCM_16"),
    ("WAV 24-bit", "wav", "PCM_24"),
    ("WAV float", "wav", "FLOAT"),
    ("FLAC 16-bit", "flac", "PCM_16"),
    ("FLAC 24-bit", "flac", "PCM_24"),
    ("Ogg/Vorbis", "ogg", "VORBIS"),
    ("Ogg/Opus", "opus", "OPUS"),
    ("MP3", "mp3", "MPEG_LAYER_III"),
]


def fidelity(expected: np.ndarray, data: bytes) -> str:
    decoded, _ = read_audio(data)
    length = "" if len(decoded) == len(expected) else f", {len(decoded) - len(expected):+d} samples"
    if np.array_equal(decoded, expected):
        return "exact"
    n = min(len(decoded), len(expected))
    corr = float(np.corrcoef(expected[:n], decoded[:n])[0, 1])
    return f"SNR {snr_db(expected, decoded):.1f} dB, r {corr:.4f}{length}"


def measure(payloads: dict, seconds: float, rounds: int) -> dict:
    times = {name: [] for name in payloads}
    order = list(payloads)
    rng = random.Random(0)
    for name in order:  # warm-up
        read_audio(payloads[name])
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            start = time.thread_time()
            read_audio(payloads[name])
            times[name].append(max(time.thread_time() - start, 1e-9))
    return {name: [seconds / t for t in ts] for name, ts in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--files", type=int, default=4, help="demo utterances joined")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rates, rounds, files = ((16000,), 3, 1) if args.tiny else ((16000, 48000), args.rounds,
                                                                 args.files)
    print(f"{files} demo utterance(s); one thread; x real time = audio s per CPU s, median "
          f"of {rounds} rounds (fastest-slowest round)")
    head = f"{'format':<12} {'subtype':<15} {'rate':>6} {'x real time':>24}  fidelity"
    print(head)
    print("-" * len(head))
    for rate in rates:
        source = demo_speech(rate, files=files)
        payloads, notes = {}, {}
        for label, codec, subtype in ROWS:
            if codec == "opus" and rate not in OPUS_RATES:
                continue
            written, expected = on_pcm_grid(source, subtype)
            payloads[label] = encode_audio(written, rate, codec, subtype=subtype)
            notes[label] = (subtype, fidelity(expected, payloads[label]))
        speeds = measure(payloads, len(source) / rate, rounds)
        for label, values in speeds.items():
            spread = f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"
            print(f"{label:<12} {notes[label][0]:<15} {rate:>6} {spread:>24}  {notes[label][1]}")


if __name__ == "__main__":
    main()
