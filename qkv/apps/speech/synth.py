"""Generated speech corpora, spoken offline by Debian's ``espeak-ng`` and ``flite``: :func:`generate_corpus`.

- ``digits``: digit strings, phone numbers, numbers up to 9999 and dates, in words ("four two seven",
  "three thousand and twelve", "the fifth of march nineteen ninety"): a small vocabulary, fast to learn.
- ``sentences``: English sentences read aloud, by default the English side of Tatoeba's English-French pairs
  (``tatoeba-eng-fra.tsv.gz``), or the lines of any text file.

Every utterance draws a voice (for the training and validation splits, flite speaks :data:`FLITE_SHARE` of them),
a speaking rate and a pitch. The ``test`` split uses texts **and voices** that the
training split does not (:data:`TEST_VOICES`: accents and voice variants never heard in training, and one flite
voice); ``valid`` holds unseen texts spoken by the training voices; ``long`` joins two or three test texts, spoken
by the test voices, so that every one is longer than any training transcript. The sentences of the text source
that no split speaks are the corpus's ``texts`` (text without audio, for a word model).

Audio is written once as 16 kHz mono 16-bit WAV under a cache folder (default ``~/.cache/qkv/speech``, or
``$QKV_CACHE/speech``), one file per (text, voice, rate, pitch), and reused by every corpus that asks for it; a
corpus's manifest (:func:`qkv.data.speech.write_manifest`) is written last, so an interrupted generation resumes.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import random
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...data.speech import SpeechCorpus, Utterance, normalize_transcript, write_manifest
from ...options import OptionError, ref
from .audio import SAMPLE_RATE, add_noise, load_audio, write_audio

logger = logging.getLogger(__name__)

__all__ = ["TRAIN_VOICES", "TEST_VOICES", "default_cache", "synthesize", "digit_texts", "number_words",
           "sentence_texts", "generate_corpus", "synth_available", "CORPORA"]

CORPORA = ("digits", "sentences")
_ESPEAK_TRAIN = ("en-us", "en-gb", "en-gb-x-rp", "en-gb-x-gbclan", "en-us-nyc")
_VARIANTS_TRAIN = ("", "+m1", "+m3", "+f1", "+f3")
#: the voices of the training and validation splits (``engine:voice``)
TRAIN_VOICES = tuple(f"espeak:{v}{x}" for v in _ESPEAK_TRAIN for x in _VARIANTS_TRAIN) + \
    ("flite:kal16", "flite:rms", "flite:slt")
#: the voices of the test and long splits: accents, variants and a flite voice the training never hears
TEST_VOICES = ("espeak:en-gb-scotland+m2", "espeak:en-029+f2", "espeak:en-gb-x-gbcwmd+m4", "flite:awb")
_VERSION = "1"
NOISE_SHARE = 0.3  #: share of the training utterances with white noise added, at 15-35 dB SNR
#: share of the training and validation utterances spoken by flite, whatever the number of voices of each engine
#: (``None``: every voice of :data:`TRAIN_VOICES` equally often, flite three in 28). flite's ``rms``, ``slt`` and
#: ``awb`` are built from recorded speakers' voices, espeak-ng's are formant synthesis: a model that hears
#: flite in 0.4 of its utterances rather than 3/28 hears the unseen voices of both more evenly (docs/apps/speech.md)
FLITE_SHARE: float | None = 0.4

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
             "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth", "eighteenth",
             "nineteenth", "twentieth"]
_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]


def default_cache() -> Path:
    """``$QKV_CACHE/speech``, else ``~/.cache/qkv/speech``."""
    root = os.environ.get("QKV_CACHE")
    return Path(root) / "speech" if root else Path.home() / ".cache" / "qkv" / "speech"


def synth_available(engine: str = "espeak") -> bool:
    """Whether ``espeak-ng`` (``engine="espeak"``) or ``flite`` is on the PATH."""
    return shutil.which("espeak-ng" if engine == "espeak" else "flite") is not None


def number_words(n: int) -> str:
    """``n`` (0 to 9999) in English words: 3012 -> 'three thousand and twelve'."""
    if not 0 <= n <= 9999:
        raise ValueError(f"number_words takes 0 to 9999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        head = f"{_ONES[n // 100]} hundred"
        return head if n % 100 == 0 else f"{head} and {number_words(n % 100)}"
    head = f"{_ONES[n // 1000]} thousand"
    rest = n % 1000
    return head if rest == 0 else f"{head} {'and ' if rest < 100 else ''}{number_words(rest)}"


def _ordinal(day: int) -> str:
    if day <= 20:
        return _ORDINALS[day - 1]
    tens = "twenty" if day < 30 else "thirty"
    return tens + ("" if day % 10 == 0 else " " + _ORDINALS[day % 10 - 1])


def _year(y: int) -> str:
    return f"{number_words(y // 100)} {number_words(y % 100) if y % 100 >= 10 else 'oh ' + _ONES[y % 100]}" \
        if y % 100 else f"{number_words(y // 100)} hundred"


def _digit_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.35:  # a digit string
        return " ".join(_ONES[rng.randrange(10)] for _ in range(rng.randint(2, 6)))
    if kind < 0.5:  # a phone number
        return " ".join(_ONES[rng.randrange(10)] for _ in range(7))
    if kind < 0.75:
        return number_words(rng.choice((rng.randrange(100), rng.randrange(10_000))))
    day, month, year = rng.randint(1, 31), rng.choice(_MONTHS), rng.randint(1900, 2030)
    if rng.random() < 0.5:
        return f"{month} {_ordinal(day)}" + (f" {_year(year)}" if rng.random() < 0.5 else "")
    return f"the {_ordinal(day)} of {month}" + (f" {_year(year)}" if rng.random() < 0.5 else "")


def digit_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct spoken-number texts (:func:`_digit_text`), in a seeded order."""
    rng, seen = random.Random(seed), {}
    for _ in range(100 * n + 1000):
        if len(seen) >= n:
            break
        seen.setdefault(_digit_text(rng), None)
    if len(seen) < n:
        raise ValueError(f"could not draw {n} distinct digit texts")
    return list(seen)


def _default_text() -> Path | None:
    here = Path(__file__).resolve().parents[3]  # the repository
    for base in (Path.cwd(), here):
        for p in (base / ".." / "shared" / "data" / "tatoeba-eng-fra.tsv.gz",
                  base / "data" / "tatoeba-eng-fra.tsv.gz"):
            if p.is_file():
                return p.resolve()
    return None


def sentence_texts(path: str | os.PathLike | None = None, *, min_words: int = 3, max_words: int = 10,
                   seed: int = 0) -> list[str]:
    """The distinct sentences of ``path`` (a text file, one per line, or a tab-separated file whose first column is
    English: Tatoeba's pairs; ``.gz`` is read), normalised, with ``min_words``-``max_words`` words and no digit, in
    a seeded order. Default: ``tatoeba-eng-fra.tsv.gz`` in ``../shared/data``."""
    p = Path(path) if path is not None else _default_text()
    if p is None:
        raise OptionError("no text for the 'sentences' corpus: give a text file, one sentence per line (" +
                          ref("text") + "); the default, ../shared/data/tatoeba-eng-fra.tsv.gz, is not there", "text")
    if not p.is_file():
        raise OptionError("no such text file: {p} (" + ref("text") + ")", "text", p=p)
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            lines = [line.split("\t")[0] for line in f]
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
        raise ValueError(f"{p}: not a UTF-8 text file ({e})") from None
    out = {}
    for line in lines:
        if any(c.isdigit() for c in line):
            continue
        text = normalize_transcript(line)
        if min_words <= len(text.split()) <= max_words:
            out.setdefault(text, None)
    texts = sorted(out)
    random.Random(seed).shuffle(texts)
    return texts


def _command(voice: str, text: str, rate: float, pitch: float, out: str) -> list[str]:
    engine, _, name = voice.partition(":")
    if engine == "espeak":
        return ["espeak-ng", "-v", name, "-s", str(int(175 * rate)), "-p", str(int(pitch)), "-w", out, text]
    if engine == "flite":
        return ["flite", "-voice", name, "--setf", f"duration_stretch={1 / rate:.3f}", "--setf",
                f"int_f0_target_mean={int(60 + pitch)}", "-t", text, "-o", out]
    raise ValueError(f"unknown voice {voice!r}: expected espeak:NAME or flite:NAME")


def synthesize(text: str, voice: str, path: str | os.PathLike, *, rate: float = 1.0, pitch: float = 50,
               snr_db: float | None = None) -> Path:
    """Speak ``text`` with ``voice`` (``espeak:en-us+f3``, ``flite:slt``) into a 16 kHz mono WAV at ``path``.
    ``rate``: speed relative to the engine's default; ``pitch``: 0-99 (espeak's scale; flite's mean f0 is 60 +
    pitch Hz); ``snr_db``: white noise added at this signal-to-noise ratio (seeded by the text)."""
    engine = voice.partition(":")[0]
    tool = "espeak-ng" if engine == "espeak" else "flite"
    if shutil.which(tool) is None:
        raise OSError(f"{tool} is not installed: speech corpora are spoken by espeak-ng and flite "
                      "(apt install espeak-ng flite, or make data)")
    with tempfile.TemporaryDirectory() as tmp:
        raw = str(Path(tmp) / "raw.wav")
        done = subprocess.run(_command(voice, text, rate, pitch, raw), capture_output=True, text=True)
        if done.returncode != 0 or not Path(raw).is_file():
            raise OSError(f"{tool} failed on {text[:40]!r} with voice {voice}: {done.stderr.strip()[:200]}")
        wave = load_audio(raw, SAMPLE_RATE)
    if snr_db is not None:
        import torch

        seed = int(hashlib.sha1(f"{voice}|{text}".encode()).hexdigest()[:8], 16)
        wave = add_noise(wave, snr_db, torch.Generator().manual_seed(seed))
    # a temporary name of this process's own: two runs filling one cache at once must not take each other's file
    part = Path(path).with_name(f".{Path(path).stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part.wav")
    try:
        write_audio(part, wave)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return Path(path)


def _pick_voice(rng: random.Random, voices: Sequence[str], flite_share: float) -> str:
    """One of ``voices``: with both engines among them, flite with probability ``flite_share``, then one of the
    engine's voices; otherwise any of ``voices``, uniformly."""
    flite = [v for v in voices if v.startswith("flite:")]
    espeak = [v for v in voices if not v.startswith("flite:")]
    if not flite or not espeak:
        return rng.choice(voices)
    return rng.choice(flite if rng.random() < flite_share else espeak)


def _plan(corpus: str, n_train: int, n_valid: int, n_test: int, n_long: int, text: str | None,
          seed: int) -> tuple[list[tuple[str, str, str, float, float, float | None]], list[str]]:
    """``(split, text, voice, rate, pitch, noise SNR in dB or None)`` of every utterance of a corpus, and the texts
    no utterance speaks (those of the text source after the splits'; none for digits)."""
    need = n_train + n_valid + n_test
    texts = digit_texts(need, seed) if corpus == "digits" else sentence_texts(text, seed=seed)
    if len(texts) < need:
        raise ValueError(f"{corpus}: {len(texts)} distinct texts, {need} needed for {n_train} train, {n_valid} "
                         f"valid and {n_test} test utterances")
    rng = random.Random(seed + 1)
    train, valid, test = texts[:n_train], texts[n_train:n_train + n_valid], texts[n_train + n_valid:need]
    longest = max(len(t) for t in train)
    long = []
    for _ in range(n_long):
        joined = rng.choice(test)
        while len(joined) <= longest or len(joined.split()) < 2:
            joined += " " + rng.choice(test)
        long.append(joined)

    def draw(split: str, t: str, voices: Sequence[str]) -> tuple[str, str, str, float, float, float | None]:
        noisy = split == "train" and rng.random() < NOISE_SHARE
        voice = rng.choice(voices)
        if FLITE_SHARE is not None and split in ("train", "valid"):  # drawn apart: the other splits stay as they are
            voice = _pick_voice(random.Random(f"{seed}|{split}|{t}"), voices, FLITE_SHARE)
        return split, t, voice, rng.uniform(0.85, 1.2), rng.uniform(30, 70), \
            rng.uniform(15, 35) if noisy else None

    plan = [draw("train", t, TRAIN_VOICES) for t in train] + [draw("valid", t, TRAIN_VOICES) for t in valid] + \
        [draw(split, t, TEST_VOICES) for split, part in (("test", test), ("long", long)) for t in part]
    return plan, [] if corpus == "digits" else texts[need:]


def generate_corpus(corpus: str, *, n_train: int, n_valid: int, n_test: int, n_long: int = 0, text: str | None = None,
                    seed: int = 0, cache: str | os.PathLike | None = None, workers: int = 2) -> SpeechCorpus:
    """The corpus ``digits`` or ``sentences`` (module docstring), generated under ``cache`` where not already
    there; ``workers`` synthesis processes at a time."""
    if corpus not in CORPORA:
        raise ValueError(f"no generated corpus {corpus!r}; one of {', '.join(CORPORA)}")
    if FLITE_SHARE is not None and not 0 <= FLITE_SHARE <= 1:
        raise ValueError(f"FLITE_SHARE must be None or in [0, 1], got {FLITE_SHARE!r}")
    root = Path(cache).expanduser() if cache is not None else default_cache()
    source = "" if corpus == "digits" else str(Path(text).resolve() if text else _default_text())
    shares = () if FLITE_SHARE is None else (FLITE_SHARE,)
    key = hashlib.sha1(repr((_VERSION, corpus, n_train, n_valid, n_test, n_long, source, seed, TRAIN_VOICES,
                             TEST_VOICES) + shares).encode()).hexdigest()[:12]
    manifest = root / f"{corpus}-{key}.tsv"
    plan, unspoken = _plan(corpus, n_train, n_valid, n_test, n_long, text, seed)
    (root / "wav").mkdir(parents=True, exist_ok=True)
    jobs = []
    for split, t, voice, rate, pitch, snr in plan:
        name = hashlib.sha1(f"{_VERSION}|{voice}|{rate:.3f}|{pitch:.1f}|{snr}|{t}".encode()).hexdigest()[:20]
        jobs.append((split, Utterance(str(root / "wav" / f"{name}.wav"), t, voice), rate, pitch, snr))
    todo = [j for j in jobs if not Path(j[1].audio).is_file()]
    if todo:
        logger.info("speaking %d utterances of %s into %s", len(todo), corpus, root)
        with ThreadPoolExecutor(max(1, workers)) as pool:
            list(pool.map(lambda j: synthesize(j[1].text, j[1].speaker, j[1].audio, rate=j[2], pitch=j[3],
                                               snr_db=j[4]), todo))
    if todo or not manifest.is_file():
        write_manifest(manifest, [(u, split) for split, u, *_ in jobs])
    splits: dict[str, list[Utterance]] = {"train": [], "valid": [], "test": []} | ({"long": []} if n_long else {})
    for number, (split, u, *_) in enumerate(jobs, 2):
        u.where = f"{manifest}:{number}"
        splits[split].append(u)
    return SpeechCorpus(splits, texts=unspoken)
