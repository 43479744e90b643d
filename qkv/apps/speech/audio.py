"""Audio for speech recognition: reading a file (any rate, any channels) as 16 kHz mono, log-mel features and
SpecAugment.

Files are read with ``soundfile`` (WAV, FLAC, OGG...) and resampled with ``librosa``; the log-mel features are
librosa's mel filterbank (Slaney's, as ``librosa.feature.melspectrogram``) applied to the power spectrum of
``torch.stft``: the filterbank comes from a well-kept library, the transform runs in torch (batched, on any device).
A file that cannot be used is a one-line ``ValueError`` naming it (missing, not audio, truncated — its header
promises more samples than it holds —, empty, too short, not finite). Both libraries are imported when first needed
(``pip install qkv[speech]``).

SpecAugment: Park et al., 2019, "SpecAugment: A Simple Data Augmentation Method for Automatic Speech Recognition"
(https://arxiv.org/abs/1904.08779), frequency and time masks only (no time warping). :func:`warp_features`
stretches the features in time (a tempo change, as speed perturbation's, Ko et al., 2015, without its change of
pitch) and along the mel axis (a vocal tract length change, as VTLP's, Jaitly and Hinton, 2013, but linear on the mel
scale rather than piecewise linear in Hz), by linear interpolation.
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["SAMPLE_RATE", "load_audio", "write_audio", "log_mel", "mel_filterbank", "spec_augment", "add_noise",
           "warp_features", "MIN_SECONDS"]

SAMPLE_RATE = 16_000  #: the rate every model reads
MIN_SECONDS = 0.1  #: shorter audio is refused: no word fits in it


def _speech_extra(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(f"speech needs {name} (pip install qkv[speech])") from None


def load_audio(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE, *, where: str | None = None,
               min_seconds: float = MIN_SECONDS) -> Tensor:
    """The samples of an audio file as ``(T,)`` float32 in [-1, 1], mono (channels averaged), at ``sample_rate``.

    ``where``: how to name the file in errors (default: its path; a manifest passes ``manifest.tsv:12: clip.wav``).
    Raises ``ValueError`` (one line, naming the file) for a missing, unreadable, truncated (fewer samples than its
    header promises), empty, too short (under ``min_seconds``) or non-finite file.
    """
    sf = _speech_extra("soundfile")
    name = where or str(path)
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{name}: {'a folder, not an audio file' if p.is_dir() else 'no such audio file'}")
    try:
        with sf.SoundFile(str(p)) as f:
            rate, promised = f.samplerate, f.frames
            data = f.read(dtype="float32", always_2d=True)
            missing = _missing_frames(f.extra_info, promised, data.shape[0])
    except (RuntimeError, TypeError, ValueError) as e:  # soundfile's LibsndfileError is a RuntimeError
        raise ValueError(f"{name}: not a readable audio file ({' '.join(str(e).split())})") from None
    if missing:
        raise ValueError(f"{name}: truncated: the header promises {data.shape[0] + missing} samples "
                         f"({(data.shape[0] + missing) / rate:.3f} s), the file holds {data.shape[0]} "
                         f"({data.shape[0] / rate:.3f} s); copy the file again, or re-save what it holds "
                         "(sox, ffmpeg) to use it")
    if data.shape[0] == 0:
        raise ValueError(f"{name}: the audio is empty (0 samples)")
    wave = data.mean(axis=1)
    if not bool(torch.isfinite(torch.from_numpy(wave)).all()):
        raise ValueError(f"{name}: the audio holds NaN or infinite samples")
    if wave.shape[0] / rate < min_seconds:
        raise ValueError(f"{name}: the audio is too short ({wave.shape[0] / rate:.3f} s, at least {min_seconds} s)")
    if rate != sample_rate:
        librosa = _speech_extra("librosa")
        wave = librosa.resample(wave, orig_sr=rate, target_sr=sample_rate)
    return torch.from_numpy(wave.copy()).float()


_FRAMES = re.compile(r"^\s*frames\s*:\s*(\d+)\s*$", re.MULTILINE | re.IGNORECASE)
_DATA_CHUNK = re.compile(r"^\s*data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
_BLOCK_ALIGN = re.compile(r"Block Align\s*:\s*(\d+)")
_UNKNOWN_LENGTH = (0, 0xFFFFFFFF, 0x7FFFFFFF)  # what streaming writers put in the header before the length is known


def _missing_frames(log: str, promised: int, read: int) -> int:
    """How many frames the header promises beyond those in the file. libsndfile reads a truncated WAV or AIFF as
    far as it goes and says so only in its log: the frame count of the header (AIFF's ``COMM``, WAV's ``fact``,
    FLAC's stream info) or the size of WAV's ``data`` chunk (``data : 32000 (should be 15978)``)."""
    m = _FRAMES.search(log)
    if m:
        declared = int(m.group(1))
        return 0 if declared in _UNKNOWN_LENGTH else max(declared - read, 0)
    m = _DATA_CHUNK.search(log)
    if m:
        declared = int(m.group(1))
        align = _BLOCK_ALIGN.search(log)
        per_frame = int(align.group(1)) if align else 0
        if declared in _UNKNOWN_LENGTH or not per_frame:
            return 0
        return max(declared // per_frame - read, 0)
    return max(promised - read, 0)


def write_audio(path: str | os.PathLike, wave: Tensor, sample_rate: int = SAMPLE_RATE) -> Path:
    """Write ``wave (T,)`` as a 16-bit PCM WAV file."""
    sf = _speech_extra("soundfile")
    sf.write(str(path), wave.detach().cpu().clamp(-1, 1).numpy(), sample_rate, subtype="PCM_16")
    return Path(path)


@functools.lru_cache(maxsize=8)
def _mel_numpy(sample_rate: int, n_fft: int, n_mels: int):
    librosa = _speech_extra("librosa")
    return librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels)


def mel_filterbank(sample_rate: int = SAMPLE_RATE, n_fft: int = 400, n_mels: int = 80) -> Tensor:
    """librosa's mel filterbank ``(n_mels, n_fft // 2 + 1)`` (Slaney's mel scale and area normalisation)."""
    return torch.from_numpy(_mel_numpy(sample_rate, n_fft, n_mels)).float()


def log_mel(wave: Tensor, sample_rate: int = SAMPLE_RATE, *, n_mels: int = 80, win_ms: float = 25.0,
            hop_ms: float = 10.0, floor: float = 1e-6) -> Tensor:
    """Log-mel features ``(F, n_mels)`` of ``wave (T,)``: ``log(mel @ |stft|^2 + floor)`` with a Hann window of
    ``win_ms`` every ``hop_ms`` (``F = 1 + T // hop``; the signal is padded by reflection at both ends)."""
    if wave.dim() != 1:
        raise ValueError(f"wave must be (T,), got {tuple(wave.shape)}")
    win = int(round(sample_rate * win_ms / 1000))
    hop = int(round(sample_rate * hop_ms / 1000))
    n_fft = 1 << max(0, math.ceil(math.log2(win)))
    if wave.shape[0] <= n_fft // 2:
        raise ValueError(f"the audio is too short for features ({wave.shape[0]} samples, more than {n_fft // 2} "
                         "needed)")
    spec = torch.stft(wave.float(), n_fft, hop_length=hop, win_length=win,
                      window=torch.hann_window(win, device=wave.device), center=True, return_complex=True)
    power = spec.abs() ** 2  # (n_fft // 2 + 1, F)
    mel = mel_filterbank(sample_rate, n_fft, n_mels).to(wave.device)
    return torch.log(mel @ power + floor).T.contiguous()


def spec_augment(features: Tensor, *, freq_masks: int = 2, freq_width: int = 10, time_masks: int = 2,
                 time_width: int = 20, max_time_share: float = 0.2, generator: torch.Generator | None = None) -> Tensor:
    """``features (F, M)`` with ``freq_masks`` bands of up to ``freq_width`` mel channels and ``time_masks`` spans
    of up to ``time_width`` frames (and at most ``max_time_share`` of the frames each) set to the mean value.
    Returns a new tensor; the input is not changed."""
    out = features.clone()
    frames, mels = out.shape
    fill = out.mean()

    def draw(high: int) -> int:
        return int(torch.randint(0, max(high, 0) + 1, (), generator=generator))

    for _ in range(freq_masks):
        width = draw(min(freq_width, mels))
        start = draw(mels - width)
        out[:, start:start + width] = fill
    for _ in range(time_masks):
        width = draw(min(time_width, int(max_time_share * frames)))
        start = draw(frames - width)
        out[start:start + width] = fill
    return out


def warp_features(features: Tensor, time: float = 1.0, freq: float = 1.0) -> Tensor:
    """``features (F, M)`` stretched by linear interpolation: ``round(F * time)`` frames (``time > 1``: slower
    speech), and along the mel channels by ``freq``: channel ``k`` reads channel ``k / freq`` of the input (the
    last channel beyond it; ``freq > 1``: formants move up, a shorter vocal tract)."""
    if features.dim() != 2 or features.shape[0] < 1:
        raise ValueError(f"features must be (F, M) with F >= 1, got {tuple(features.shape)}")
    if not (0.5 <= time <= 2.0 and 0.5 <= freq <= 2.0):
        raise ValueError(f"time and freq factors must be in [0.5, 2], got {time} and {freq}")
    frames, mels = features.shape
    x = features.float()
    if freq != 1.0:
        src = (torch.arange(mels, dtype=torch.float32) / freq).clamp(max=mels - 1)
        low = src.floor().long()
        high = (low + 1).clamp(max=mels - 1)
        w = src - low
        x = x[:, low] * (1 - w) + x[:, high] * w
    n = max(1, round(frames * time))
    if n != frames:
        x = torch.nn.functional.interpolate(x.T[None], size=n, mode="linear", align_corners=True)[0].T
    return x.to(features.dtype)


def add_noise(wave: Tensor, snr_db: float, generator: torch.Generator | None = None) -> Tensor:
    """``wave`` plus white noise at a signal-to-noise ratio of ``snr_db`` decibels."""
    power = wave.pow(2).mean().clamp(min=1e-12)
    noise = torch.randn(wave.shape, generator=generator, dtype=wave.dtype)
    return wave + noise * torch.sqrt(power / (10 ** (snr_db / 10)))
