"""Reading one corpus from where other tools keep it: speechpipe manifest, lhotse, Shar, datasets.

The demo corpus (36 FLAC utterances, 174 s of 16 kHz speech), prepared once in each form,
is read to decoded samples (``audio`` float32, ``sample_rate``) through each road:

- ``manifest + load_audio``: speechpipe's own manifest rows, ``load_audio`` (soundfile) -- the
  reference;
- ``lhotse cuts + load_lhotse``: ``sp.read_lhotse`` over a ``CutSet`` written by
  ``sp.write_lhotse``, the audio read by lhotse's ``cut.load_audio()``;
- ``lhotse Shar``: ``sp.read_lhotse_shar`` over ``CutSet.to_shar`` (FLAC in tar shards);
- ``datasets (bytes in arrow)``: ``sp.read_hf_dataset`` over ``save_to_disk`` /
  ``load_from_disk`` (the FLAC bytes embedded), decoded with soundfile;
- ``datasets rows + load_hf_audio``: the manifest rows (``with_audio=False``) then
  ``load_hf_audio``, as the recipe builders read a dataset (rows after the shuffle).

Each road is one full pass over the corpus, in one thread, the roads taking turns round after
round (each round in a rotated order, so that none always runs first); a warm-up round is
dropped. Reported: seconds of audio per second of wall time (median over rounds, with the
smallest and largest round) and the ratio of the medians to the reference. No timing is
asserted; figures from a loaded machine are not final.

    python -m benchmarks bench_interop           # 7 rounds
    python -m benchmarks bench_interop --tiny    # 6 utterances, 2 rounds (a few seconds)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable

import speechpipe as sp
from speechpipe.demo import DEMO_CORPUS
from speechpipe.recipes.librispeech import prepare_librispeech

#: A road: builds a fresh pipe of decoded samples for each pass.
Road = Callable[[], object]


def prepare(root: str, rows: list) -> dict[str, Road]:
    """Write the corpus in each form under ``root``; the roads that read it."""
    import datasets
    import lhotse

    datasets.disable_progress_bars()
    cuts_path = os.path.join(root, "cuts.jsonl.gz")
    sp.write_lhotse(rows, cuts=cuts_path)
    shar = os.path.join(root, "shar")
    os.makedirs(shar)
    lhotse.CutSet.from_file(cuts_path).to_shar(shar, fields={"recording": "flac"},
                                               shard_size=12)
    hf_dir = os.path.join(root, "hf")
    table = datasets.Dataset.from_dict({"audio": [r["audio_path"] for r in rows],
                                        "id": [r["key"] for r in rows]})
    table.cast_column("audio", datasets.Audio()).save_to_disk(hf_dir)
    hf = datasets.load_from_disk(hf_dir)
    return {
        "manifest + load_audio": lambda: sp.IterableWrapper(rows).load_audio(),
        "lhotse cuts + load_lhotse": lambda: sp.read_lhotse(cuts_path).load_lhotse(),
        "lhotse Shar": lambda: sp.read_lhotse_shar(shar),
        "datasets (bytes in arrow)": lambda: sp.read_hf_dataset(hf, key_column="id"),
        "datasets rows + load_hf_audio": lambda: sp.read_hf_dataset(
            hf, key_column="id", with_audio=False).load_hf_audio(hf),
    }


def one_pass(road: Road) -> tuple[float, float]:
    """``(seconds of audio, wall seconds)`` of one pass."""
    start = time.perf_counter()
    audio = sum(s["audio"].shape[0] / s["sample_rate"] for s in road())
    return audio, time.perf_counter() - start


def run(rows: list, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        roads = prepare(root, rows)
        names = list(roads)
        speeds: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds + 1):  # round 0: warm-up
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                audio, seconds = one_pass(roads[name])
                if r:
                    speeds[name].append(audio / seconds)
    ref = statistics.median(speeds[names[0]])
    print(f"{len(rows)} utterances, {rounds} rounds; × real time (median, [min, max]), "
          f"ratio to the manifest road")
    for name in names:
        med = statistics.median(speeds[name])
        print(f"  {name:32s} {med:8.0f} [{min(speeds[name]):.0f}, {max(speeds[name]):.0f}]"
              f"  {med / ref:5.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    rows = prepare_librispeech(DEMO_CORPUS, progress=False)["dev-clean"]  # manifest rows
    if args.tiny:
        run(rows[:6], 2)
    else:
        run(rows, args.rounds)


if __name__ == "__main__":
    main()
