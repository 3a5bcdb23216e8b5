#!/usr/bin/env python3
"""Regenerate the synthesized demo corpus shipped in ``speechpipe/demo_data/LibriSpeech``.

The demo corpus is a tiny stand-in for LibriSpeech ``dev-clean``: 36 utterances of real
(synthesized) English speech by 4 "speakers" (eSpeak NG voices), laid out exactly like the
official corpus (``<subset>/<spk>/<chapter>/<spk>-<chapter>-<utt:04d>.flac`` + one
``<spk>-<chapter>.trans.txt`` per chapter, ``SPEAKERS.TXT``, ``CHAPTERS.TXT``, ``README.TXT``).
The texts are sentences from public-domain books (Project Gutenberg).

The output is committed, so nobody needs this script to use speechpipe or run its examples.
To regenerate it you need the Debian packages ``espeak-ng`` and ``sox`` (plus the Python
package ``soundfile``, a speechpipe dependency)::

    apt-get install -y espeak-ng sox
    .venv/bin/python tools/make_demo_corpus.py          # rewrites speechpipe/demo_data/LibriSpeech
    .venv/bin/python tools/make_demo_corpus.py --check  # builds in a temp dir, compares bytes

The script is deterministic: eSpeak NG has no randomness, SoX runs with ``-R`` (repeatable)
and ``-D`` (no dither), and FLAC is encoded by libsndfile at a fixed compression level, so the
same tool versions give byte-identical files. Other eSpeak NG / SoX / libFLAC versions may
give slightly different audio (and so MINUTES / durations); the transcripts do not change.

Pipeline per utterance: ``espeak-ng -v VOICE -s WPM -p PITCH -w x.wav TEXT`` (22.05 kHz) →
``sox -R -D x.wav -r 16000 -c 1 -b 16 y.wav pad 0.15 0 gain -n -6`` (resample to 16 kHz
mono 16-bit, 150 ms of leading silence, peak-normalize to -6 dBFS) → ``soundfile.write(...,
format="FLAC", subtype="PCM_16")``. Transcripts are normalized the LibriSpeech way: upper
case, no punctuation except word-internal apostrophes, hyphens split words, ``Mr.`` →
``MISTER``, ``Mrs.`` → ``MISSUS``.
"""

from __future__ import annotations

import argparse
import filecmp
import io
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

SUBSET = "dev-clean"
SAMPLE_RATE = 16000
LEADING_SILENCE_S = 0.15
PEAK_DBFS = -6
FLAC_COMPRESSION_LEVEL = 1.0  # libsndfile's 0..1 scale; 1.0 = libFLAC level 8
MARKER = "speechpipe demo corpus"  # first line of README.TXT; guards the rmtree below

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "speechpipe" / "demo_data" / "LibriSpeech"


@dataclass(frozen=True)
class Chapter:
    chapter_id: int
    book: str
    author: str
    gutenberg_id: int
    title: str
    sentences: tuple[str, ...]


@dataclass(frozen=True)
class Speaker:
    speaker_id: int
    sex: str  # "M" / "F", as in SPEAKERS.TXT
    voice: str  # espeak-ng voice[+variant]
    wpm: int  # espeak-ng -s
    pitch: int  # espeak-ng -p (0..99, default 50)
    chapters: tuple[Chapter, ...]

    @property
    def name(self) -> str:
        return f"espeak-ng {self.voice} s{self.wpm} p{self.pitch}"


ALICE = ("Alice's Adventures in Wonderland", "Lewis Carroll", 11)
PRIDE = ("Pride and Prejudice", "Jane Austen", 1342)
HOLMES = ("The Adventures of Sherlock Holmes", "Arthur Conan Doyle", 1661)
CAROL = ("A Christmas Carol", "Charles Dickens", 46)

SPEAKERS: tuple[Speaker, ...] = (
    Speaker(1001, "M", "en-us+m3", 170, 40, (
        Chapter(100101, *ALICE, "Chapter I: Down the Rabbit-Hole", (
            "Alice was beginning to get very tired of sitting by her sister on the bank, "
            "and of having nothing to do.",
            "Down, down, down.",
            "Would the fall never come to an end?",
            "There was nothing so very remarkable in that; nor did Alice think it so very much "
            "out of the way to hear the Rabbit say to itself, \"Oh dear! Oh dear! "
            "I shall be late!\"",
            "There was not a moment to be lost.",
        )),
        Chapter(100102, *ALICE, "Chapter VII: A Mad Tea-Party", (
            "\"Have some wine,\" the March Hare said in an encouraging tone.",
            "Alice looked all round the table, but there was nothing on it but tea.",
            "\"Take some more tea,\" the March Hare said to Alice, very earnestly.",
            "\"I've had nothing yet,\" Alice replied in an offended tone, "
            "\"so I can't take more.\"",
        )),
    )),
    Speaker(1002, "F", "en-gb+f2", 160, 60, (
        Chapter(100201, *PRIDE, "Chapter 1", (
            "It is a truth universally acknowledged, that a single man in possession of a good "
            "fortune, must be in want of a wife.",
            "\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard that "
            "Netherfield Park is let at last?\"",
            "Mr. Bennet replied that he had not.",
            "\"But it is,\" returned she; \"for Mrs. Long has just been here, and she told me "
            "all about it.\"",
            "Mr. Bennet made no answer.",
            "\"Do you not want to know who has taken it?\" cried his wife impatiently.",
            "\"You want to tell me, and I have no objection to hearing it.\"",
            "This was invitation enough.",
            "Mr. Bennet was so odd a mixture of quick parts, sarcastic humour, reserve, and "
            "caprice, that the experience of three-and-twenty years had been insufficient to "
            "make his wife understand his character.",
        )),
    )),
    Speaker(1003, "F", "en-us+f4", 175, 55, (
        Chapter(100301, *HOLMES, "Adventure I: A Scandal in Bohemia", (
            "To Sherlock Holmes she is always the woman.",
            "I have seldom heard him mention her under any other name.",
            "In his eyes she eclipses and predominates the whole of her sex.",
            "It was not that he felt any emotion akin to love for Irene Adler.",
            "\"You see, but you do not observe. The distinction is clear.\"",
        )),
        Chapter(100302, *ALICE, "Chapter II: The Pool of Tears", (
            "\"Curiouser and curiouser!\" cried Alice.",
            "Who in the world am I? Ah, that's the great puzzle!",
            "\"I wish I hadn't cried so much!\" said Alice, as she swam about, trying to find "
            "her way out.",
            "Just then she heard something splashing about in the pool a little way off, and "
            "she swam nearer to make out what it was.",
        )),
    )),
    Speaker(1004, "M", "en-gb-scotland+m1", 150, 35, (
        Chapter(100401, *CAROL, "Stave One: Marley's Ghost", (
            "Marley was dead: to begin with.",
            "There is no doubt whatever about that.",
            "The register of his burial was signed by the clergyman, the clerk, the "
            "undertaker, and the chief mourner.",
            "Scrooge signed it.",
            "Old Marley was as dead as a door-nail.",
            "Oh! But he was a tight-fisted hand at the grindstone, Scrooge! a squeezing, "
            "wrenching, grasping, scraping, clutching, covetous, old sinner!",
            "Hard and sharp as flint, from which no steel had ever struck out generous fire; "
            "secret, and self-contained, and solitary as an oyster.",
            "External heat and cold had little influence on Scrooge.",
            "\"Bah!\" said Scrooge, \"Humbug!\"",
        )),
    )),
)

_ABBREVIATIONS = {"Mr.": "Mister", "Mrs.": "Missus"}


def normalize_transcript(text: str) -> str:
    """Return ``text`` as a LibriSpeech transcript (upper case, apostrophes only inside words).

    >>> normalize_transcript('"I\\'ve had it," said Mr. Bennet; a door-nail.')
    "I'VE HAD IT SAID MISTER BENNET A DOOR NAIL"
    """
    for short, full in _ABBREVIATIONS.items():
        text = text.replace(short, full)
    if re.search(r"\d", text):
        raise ValueError(f"digits are not normalized, spell them out: {text!r}")
    text = re.sub(r"[^A-Za-z']+", " ", text)  # hyphens, dashes, punctuation -> word break
    text = re.sub(r"(?<![A-Za-z])'|'(?![A-Za-z])", " ", text)  # quote marks, not apostrophes
    return " ".join(text.upper().split())


def _run(cmd: list[str]) -> bytes:
    try:
        done = subprocess.run(cmd, check=True, capture_output=True)
    except FileNotFoundError as exc:
        raise SystemExit(f"{cmd[0]} not found: apt-get install -y espeak-ng sox") from exc
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{' '.join(cmd)} failed: {exc.stderr.decode(errors='replace')}") from exc
    return done.stdout


def tool_versions() -> tuple[str, str]:
    """Return e.g. ("eSpeak NG 1.51", "SoX v14.4.2") for README.TXT."""
    espeak = _run(["espeak-ng", "--version"]).decode()
    sox = _run(["sox", "--version"]).decode()
    espeak_v = re.search(r"text-to-speech:\s*(\S+)", espeak)
    sox_v = re.search(r"SoX (v\S+)", sox)
    return (f"eSpeak NG {espeak_v.group(1) if espeak_v else espeak.strip()}",
            f"SoX {sox_v.group(1) if sox_v else sox.strip()}")


def synthesize(speaker: Speaker, text: str, workdir: Path) -> tuple[bytes, float]:
    """Speak ``text`` and return (16 kHz mono 16-bit FLAC bytes, duration in seconds)."""
    raw = workdir / "espeak.wav"
    wav = workdir / "16k.wav"
    _run(["espeak-ng", "-v", speaker.voice, "-s", str(speaker.wpm), "-p", str(speaker.pitch),
          "-w", str(raw), "--", text])
    _run(["sox", "-R", "-D", "-V1", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16",
          "-e", "signed-integer", str(wav), "pad", str(LEADING_SILENCE_S), "0",
          "gain", "-n", str(PEAK_DBFS)])
    audio, rate = sf.read(str(wav), dtype="int16")
    if rate != SAMPLE_RATE or audio.ndim != 1:
        raise SystemExit(f"sox produced {rate} Hz, shape {audio.shape} for {text!r}")
    buf = io.BytesIO()
    sf.write(buf, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16",
             compression_level=FLAC_COMPRESSION_LEVEL)
    return buf.getvalue(), len(audio) / SAMPLE_RATE


def _bar_table(header: str, rows: list[list[str]], widths: list[int]) -> list[str]:
    """LibriSpeech-style ``|`` table: first cell flush left, the others after one space."""
    lines = [header]
    for row in rows:
        cells = [f"{row[0]:<{widths[0]}}"] + [f" {c:<{w}}" for c, w in zip(row[1:], widths[1:])]
        lines.append("|".join(cells).rstrip())
    return lines


def write_corpus(out: Path) -> tuple[int, float]:
    """Write the whole corpus under ``out`` (which must not exist). Returns (utts, seconds)."""
    espeak_version, sox_version = tool_versions()
    minutes: dict[int, float] = {}
    n_utts = 0
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for spk in SPEAKERS:
            for ch in spk.chapters:
                chdir = out / SUBSET / str(spk.speaker_id) / str(ch.chapter_id)
                chdir.mkdir(parents=True)
                lines = []
                seconds = 0.0
                for n, sentence in enumerate(ch.sentences):
                    utt_id = f"{spk.speaker_id}-{ch.chapter_id}-{n:04d}"
                    flac, dur = synthesize(spk, sentence, Path(tmp))
                    (chdir / f"{utt_id}.flac").write_bytes(flac)
                    lines.append(f"{utt_id} {normalize_transcript(sentence)}\n")
                    seconds += dur
                n_utts += len(lines)
                total += seconds
                minutes[ch.chapter_id] = seconds / 60
                trans = chdir / f"{spk.speaker_id}-{ch.chapter_id}.trans.txt"
                trans.write_text("".join(sorted(lines)), encoding="utf-8", newline="\n")

    speakers = _bar_table(
        ";ID  |SEX| SUBSET           |MINUTES| NAME",
        [[str(s.speaker_id), s.sex, SUBSET,
          f"{sum(minutes[c.chapter_id] for c in s.chapters):.2f}", s.name] for s in SPEAKERS],
        [5, 2, 17, 6, 0],
    )
    chapters = _bar_table(
        ";ID    |READER|MINUTES| SUBSET           | PROJ.|BOOK ID| CH. TITLE"
        "                          | PROJECT TITLE",
        [[str(c.chapter_id), str(s.speaker_id), f"{minutes[c.chapter_id]:.2f}", SUBSET, "0",
          str(c.gutenberg_id), c.title, c.book] for s in SPEAKERS for c in s.chapters],
        [7, 5, 6, 17, 5, 6, 34, 0],
    )
    note = [
        f"; {MARKER}: SYNTHESIZED speech (espeak-ng), not LibriSpeech. See README.TXT.",
        "; Format as in LibriSpeech. NAME = espeak-ng voice, words per minute (s), pitch (p).",
    ]
    (out / "SPEAKERS.TXT").write_text("\n".join(note + speakers) + "\n", encoding="utf-8")
    cnote = [
        note[0],
        "; Format as in LibriSpeech. PROJ. is 0 (no LibriVox project); BOOK ID is the Project",
        "; Gutenberg ebook number of the public-domain source text.",
    ]
    (out / "CHAPTERS.TXT").write_text("\n".join(cnote + chapters) + "\n", encoding="utf-8")
    (out / "README.TXT").write_text(
        _readme(espeak_version, sox_version, n_utts, total), encoding="utf-8")
    return n_utts, total


def _readme(espeak_version: str, sox_version: str, n_utts: int, seconds: float) -> str:
    voices = "\n".join(
        f"  {s.speaker_id}  {s.sex}  {f'espeak-ng -v {s.voice} -s {s.wpm} -p {s.pitch}':<46}"
        f"chapters {', '.join(str(c.chapter_id) for c in s.chapters)}"
        for s in SPEAKERS
    )
    books = sorted({(c.book, c.author, c.gutenberg_id) for s in SPEAKERS for c in s.chapters})
    sources = "\n".join(f"  {b} by {a} (Project Gutenberg ebook #{g})" for b, a, g in books)
    return f"""{MARKER} (LibriSpeech layout)
{"=" * (len(MARKER) + 21)}

This is NOT LibriSpeech. It is a tiny corpus of SYNTHESIZED English speech in the exact
on-disk layout of LibriSpeech (openslr.org/12), so that speechpipe's LibriSpeech recipe,
examples and tests run offline on real audio without downloading anything.

  {n_utts} utterances, {seconds:.1f} seconds, 4 speakers, 1 subset ({SUBSET})
  {SUBSET}/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt
  {SUBSET}/<speaker>/<chapter>/<speaker>-<chapter>-<utt:04d>.flac   16 kHz mono 16-bit FLAC
  SPEAKERS.TXT, CHAPTERS.TXT: LibriSpeech's "|"-separated format with ";" comment headers

Transcripts follow LibriSpeech: one line per utterance, "<utt-id> <UPPERCASE WORDS>", no
punctuation except apostrophes inside words, sorted by utterance id.

Provenance
----------
Synthesized with {espeak_version}
Resampled and normalized with {sox_version}
(espeak-ng 22.05 kHz output -> 16 kHz mono 16-bit, 150 ms leading silence, peak -6 dBFS),
encoded to FLAC with libsndfile (python-soundfile).

Speakers (espeak-ng voice+variant, words per minute, pitch):
{voices}

Texts: sentences (some cut at a clause boundary) from
{sources}

Licence: the texts are in the public domain (published 1813-1892; Project Gutenberg
editions). The audio was generated from them with espeak-ng (a GPL-3.0 program, used here
only as a tool) and is distributed with speechpipe under speechpipe's licence (Apache-2.0).

Regenerate (needs the Debian packages espeak-ng and sox):

  apt-get install -y espeak-ng sox
  .venv/bin/python tools/make_demo_corpus.py          # rewrite this directory
  .venv/bin/python tools/make_demo_corpus.py --check  # compare a fresh build with it
"""


def _same_tree(a: Path, b: Path) -> list[str]:
    files_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    diffs = sorted(set(files_a) ^ set(files_b))
    diffs += [f for f in files_a if f in set(files_b)
              and not filecmp.cmp(a / f, b / f, shallow=False)]
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"corpus root to (re)write (default: {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true",
                        help="build in a temp dir and report files that differ from --out")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "LibriSpeech"
            write_corpus(fresh)
            diffs = _same_tree(fresh, out)
        for d in diffs:
            print(f"differs: {d}")
        print("identical" if not diffs else f"{len(diffs)} file(s) differ")
        return 1 if diffs else 0
    if out.exists():
        readme = out / "README.TXT"
        if not readme.is_file() or not readme.read_text(encoding="utf-8").startswith(MARKER):
            raise SystemExit(f"refusing to delete {out}: it is not a corpus made by this script")
        shutil.rmtree(out)
    n_utts, seconds = write_corpus(out)
    print(f"wrote {n_utts} utterances, {seconds:.1f} s, to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
