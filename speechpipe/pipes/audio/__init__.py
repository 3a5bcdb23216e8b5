"""Audio and features: channels, resampling, fbank/MFCC, augmentation, noise, CMVN.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._augment import (
    change_speed, GAIN, PAPER_BINS, PAPER_FREQ_WIDTH, played_at, spec_augment,
    spec_augment_batch, SpecAugmenter, SpecAugmenterIterDataPipe, SPEED, SpeedPerturber,
    SpeedPerturberIterDataPipe, time_warp, VolumePerturber, VolumePerturberIterDataPipe,
)
from ._channels import (
    ChannelPicker, ChannelPickerIterDataPipe, Downmixer, DownmixerIterDataPipe, resample_audio,
    Resampler, ResamplerIterDataPipe, RESAMPLING_METHODS,
)
from ._cmvn import (
    CmvnApplier, CmvnApplierIterDataPipe, CmvnStats, cmvn_stats_of_part, compute_cmvn_stats,
    merge_cmvn_stats, normalize_batch, normalize_features, VAR_FLOOR,
)
from ._common import (
    audio_of, batch_feats_of, batch_where, channels_first, check_real, check_sample,
    checked_audio, feats_of, FLOAT32, resampler, sample_where, source_len, time_first,
    to_tensor, torch_generator, valid_frames,
)
from ._fbank import (
    fbank, fbank_frames, FbankOptions, log_mel, LogMelOptions, mfcc, MfccOptions, WINDOW_TYPES,
)
from ._features import (
    BACKENDS, batch_features,
    compute_features, extract_features, FEATURE_KINDS, FeatureComputer,
    FeatureComputerIterDataPipe, FeatureExtractor, KALDI_SCALE, mel_num_frames, num_frames,
    SPEECH_DEFAULTS,
)
from ._noise import (
    AUGMENT, convolve_rir, fast_fft_len, mix_at_snr, noise_segment, NoiseAdder,
    NoiseAdderIterDataPipe, RirConvolver, RirConvolverIterDataPipe, snr_db,
)

__all__ = [
    "AUGMENT",
    "BACKENDS",
    "ChannelPicker",
    "ChannelPickerIterDataPipe",
    "CmvnApplier",
    "CmvnApplierIterDataPipe",
    "CmvnStats",
    "Downmixer",
    "DownmixerIterDataPipe",
    "FEATURE_KINDS",
    "FLOAT32",
    "FbankOptions",
    "FeatureComputer",
    "FeatureComputerIterDataPipe",
    "GAIN",
    "KALDI_SCALE",
    "LogMelOptions",
    "MfccOptions",
    "NoiseAdder",
    "NoiseAdderIterDataPipe",
    "PAPER_BINS",
    "PAPER_FREQ_WIDTH",
    "RESAMPLING_METHODS",
    "Resampler",
    "ResamplerIterDataPipe",
    "RirConvolver",
    "RirConvolverIterDataPipe",
    "SPEECH_DEFAULTS",
    "SPEED",
    "SpecAugmenter",
    "SpecAugmenterIterDataPipe",
    "SpeedPerturber",
    "SpeedPerturberIterDataPipe",
    "VAR_FLOOR",
    "VolumePerturber",
    "VolumePerturberIterDataPipe",
    "WINDOW_TYPES",
    "audio_of",
    "batch_feats_of",
    "batch_features",
    "batch_where",
    "change_speed",
    "channels_first",
    "check_real",
    "check_sample",
    "checked_audio",
    "cmvn_stats_of_part",
    "compute_cmvn_stats",
    "compute_features",
    "convolve_rir",
    "fast_fft_len",
    "fbank",
    "fbank_frames",
    "feats_of",
    "log_mel",
    "mel_num_frames",
    "merge_cmvn_stats",
    "mfcc",
    "mix_at_snr",
    "noise_segment",
    "normalize_batch",
    "normalize_features",
    "num_frames",
    "played_at",
    "resample_audio",
    "resampler",
    "sample_where",
    "snr_db",
    "source_len",
    "spec_augment",
    "spec_augment_batch",
    "time_first",
    "time_warp",
    "to_tensor",
    "torch_generator",
    "valid_frames",
]
