"""What :func:`~speechpipe.pack.pack_data` did: :class:`PackReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PackReport"]

EXAMPLES = 5  # keys shown per reported category


@dataclass
class PackReport:
    """What :func:`pack_data` did.

    Attributes:
        out_dir: the output folder.
        kind: ``"feats"`` or ``"wav"`` (audio).
        length_unit: unit of the lengths in the index and of the group ranges.
        groups: utterances packed per folder (``"."`` without length groups, else ``lo_hi``).
        shards_written: shards written by this run.
        shards_skipped: shards already complete from an earlier run, kept as they were.
        bytes_total: size of all shards of the pack.
        bytes_written: size of the shards written by this run.
        out_of_range: utterances outside every length group (not packed).
        out_of_range_examples: a few of them, ``"key (length n)"``.
        keys_without_label: utterances with data but no label (not packed).
        keys_without_label_examples: a few of their keys.
        labels_without_data: labels whose key has no data (not packed).
        labels_without_data_examples: a few of their keys.
        stale_shards: files in an output folder named like a shard but not part of this pack
            (left over from an earlier pack of other inputs; not deleted, not indexed).
        removed: files of other packs deleted by ``force=True`` (their shards and indexes).
        index_paths: the ``index.jsonl`` files written.
        clipped: utterances (of the shards written by this run) with samples beyond
            ``[-1, 1)`` that ``audio_format="flac16"`` clipped to the 16-bit range.
        sample_rates: ``{Hz: utterances}`` of the audio (empty for features).
        unreadable: utterances left out by ``on_error="skip"`` because their data is missing,
            unreadable, truncated or corrupt (each counted once);
            ``unreadable_examples``: a few of them, each naming its file, line and key.
        empty_text: utterances whose label is empty; ``empty_text_examples``: a few keys;
            ``empty_text_policy``: whether they were packed (``"keep"``) or not (``"skip"``).
        seconds: wall-clock time.
    """

    out_dir: str
    kind: str
    length_unit: str
    groups: dict[str, int] = field(default_factory=dict)
    shards_written: int = 0
    shards_skipped: int = 0
    bytes_total: int = 0
    bytes_written: int = 0
    out_of_range: int = 0
    out_of_range_examples: list[str] = field(default_factory=list)
    keys_without_label: int = 0
    keys_without_label_examples: list[str] = field(default_factory=list)
    labels_without_data: int = 0
    labels_without_data_examples: list[str] = field(default_factory=list)
    stale_shards: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    index_paths: list[str] = field(default_factory=list)
    clipped: int = 0
    sample_rates: dict[int, int] = field(default_factory=dict)
    empty_text: int = 0
    empty_text_examples: list[str] = field(default_factory=list)
    empty_text_policy: str = "error"
    unreadable: int = 0
    unreadable_examples: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def utterances(self) -> int:
        """Utterances packed, over all groups."""
        return sum(self.groups.values())

    @property
    def shards(self) -> int:
        return self.shards_written + self.shards_skipped

    def report(self) -> str:
        """A few lines for people: counts per group, what was left out and why, sizes, time."""
        lines = [
            f"pack: {self.utterances} utterances ({self.kind}, lengths in {self.length_unit}) "
            f"in {self.shards} shard(s) under {self.out_dir}"
        ]
        for name, count in self.groups.items():
            lines.append(f"  {name}/: {count} utterances")
        if self.sample_rates:
            lines.append("  sample rates: " + ", ".join(
                f"{rate} Hz: {count}" for rate, count in self.sample_rates.items()))
        if self.clipped:
            lines.append(f"  clipped to 16 bits (flac16; samples beyond [-1, 1)): "
                         f"{self.clipped} utterance(s)")
        if self.out_of_range:
            lines.append(f"  outside every length group (not packed): {self.out_of_range} "
                         f"(e.g. {', '.join(self.out_of_range_examples)})")
        if self.empty_text:
            done = "packed" if self.empty_text_policy == "keep" else "not packed"
            lines.append(f"  empty labels ({done}): {self.empty_text} (e.g. "
                         f"{', '.join(repr(k) for k in self.empty_text_examples)})")
        if self.unreadable:
            lines.append(f"  unreadable data (not packed, --on-error skip): "
                         f"{self.unreadable} utterance(s), e.g.:")
            lines.extend(f"    {example}" for example in self.unreadable_examples)
        for what, count, examples in (
            ("keys without a label", self.keys_without_label, self.keys_without_label_examples),
            ("labels without data", self.labels_without_data,
             self.labels_without_data_examples),
        ):
            if count:
                lines.append(f"  {what} (not packed): {count} (e.g. "
                             f"{', '.join(repr(k) for k in examples)})")
        lines.append(
            f"  shards: {self.shards_written} written, {self.shards_skipped} already complete "
            f"(kept); {_size(self.bytes_total)} in all, {_size(self.bytes_written)} written"
        )
        if self.removed:
            lines.append(f"  removed (--force): {len(self.removed)} file(s) of another pack: "
                         f"{', '.join(self.removed[:EXAMPLES])}")
        if self.stale_shards:
            lines.append(f"  warning: {len(self.stale_shards)} file(s) named like shards are not "
                         f"part of this pack (delete them before reading the folder with a "
                         f"glob, or pack again with --force): "
                         f"{', '.join(self.stale_shards[:EXAMPLES])}")
        lines.append(f"  time: {self.seconds:.1f} s")
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover
