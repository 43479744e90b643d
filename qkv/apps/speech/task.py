"""Speech recognition's data, model and the trainer's task: :func:`load_data`, :func:`model_spec`,
:func:`evaluate_transcripts` (the metric) and :class:`SpeechTask`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...options import OptionError, ref
from ...train.alignment import AlignmentCheck, alignment_stats, guided_attention_loss
from ..base import ApplicationTask
from .decode import pad_features, speech_metrics, transcribe_batch, utterance_features
from .options import SpeechOptions

logger = logging.getLogger(__name__)

#: what to do when the attention has not aligned (:class:`~qkv.train.alignment.AlignmentCheck`)
ALIGN_ADVICE = ("its transcripts will not follow the audio; train again with another --seed, or give the attention "
                "a CTC head (--ctc-weight 0.3) and a prior for the diagonal (--guided 1, longer with --guided-until "
                "2000): the defaults of las")

__all__ = ["load_data", "model_spec", "SpeechTask", "speech_tokenizer", "read_features", "join_pairs",
           "decoding_options", "evaluate_transcripts"]


def speech_tokenizer():
    """The characters every speech model spells: :data:`qkv.data.speech.ALPHABET` (``<pad>`` is CTC's blank)."""
    from ...data import CharTokenizer
    from ...data.speech import ALPHABET

    return CharTokenizer(ALPHABET)


def load_data(options: SpeechOptions):
    """The :class:`qkv.data.speech.SpeechCorpus` ``options`` describe: generated (``digits``, ``sentences``), a
    manifest or a LibriSpeech folder; every split must hold an utterance."""
    from ...data.speech import SpeechCorpus, read_librispeech, read_manifest, split_utterances

    o = options
    if o.generated:
        from .synth import generate_corpus

        corpus = generate_corpus(o.data, n_train=o.n_train, n_valid=o.n_valid, n_test=o.n_test, n_long=o.n_long,
                                 text=o.text, seed=o.data_seed, cache=o.cache)
    else:
        path = Path(o.data)
        if path.is_dir():
            utterances, skipped = read_librispeech(path, on_error=o.on_error)
        elif path.is_file():
            utterances, skipped = read_manifest(path, on_error=o.on_error)
        else:
            raise OptionError("no such manifest or folder: {path} (" + ref("data") + ": digits, sentences, a manifest "
                              "or a LibriSpeech folder)", "data", path=o.data)
        if skipped:
            logger.warning("%s: skipped %s", o.data, ", ".join(f"{n} ({why})" for why, n in skipped.items()))
        corpus = SpeechCorpus(split_utterances(utterances, valid=o.valid, test=o.test, seed=o.data_seed), skipped)
    sizes = {s: len(u) for s, u in corpus.splits.items()}
    if not all(sizes[s] for s in ("train", "valid", "test")):
        raise ValueError(f"{o.data}: too few utterances to split: {', '.join(f'{n} {s}' for s, n in sizes.items())}; "
                         "every split needs one (at least 3 speakers or sentences)")
    return corpus


def read_features(utterances, n_mels: int, on_error: str = "raise") -> tuple[list[Tensor], list[int], int]:
    """The features of ``utterances`` (in order), the indices of those read, and how many could not be (skipped
    with ``on_error="skip"``; otherwise the first bad file is a ``ValueError`` naming it and its manifest line)."""
    from .audio import load_audio

    feats, kept, bad = [], [], 0
    for i, u in enumerate(utterances):
        try:
            feats.append(utterance_features(load_audio(u.audio, where=u.name()), n_mels).half())
        except ValueError:
            if on_error == "raise":
                raise
            bad += 1
            continue
        kept.append(i)
    if bad:
        logger.warning("skipped %d unreadable audio files", bad)
    return feats, kept, bad


def model_spec(options: SpeechOptions, *, vocab_size: int, n_mels: int) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`."""
    o = options
    config: dict[str, Any] = {"vocab_size": vocab_size, "n_mels": n_mels, "num_layers": o.num_layers,
                              "dropout": o.dropout}
    if o.model == "transformer":
        config.update(dim=o.dim, num_heads=o.num_heads, ffn_dim=o.ffn_dim, num_decoder_layers=o.num_decoder_layers,
                      max_len=max(1024, o.max_decode_len + 2), ctc=o.ctc_weight > 0)
        return {"name": "speech-transformer", "config": config}
    config.update(hidden_dim=o.hidden_dim, listener=o.listener, reduction=o.reduction)
    if o.model == "ctc":
        return {"name": "speech-ctc", "config": config}
    config.update(embed_dim=o.embed_dim, decoder_dim=o.decoder_dim, attn_dim=o.attn_dim, score=o.score,
                  filters=o.filters, kernel_size=o.kernel_size, beta=o.beta, smoothing=o.smoothing,
                  ctc=o.ctc_weight > 0)
    return {"name": "speech-las", "config": config}


class _Examples:
    def __init__(self, features: list[Tensor], ids: list[list[int]]):
        self.features, self.ids = features, ids

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int):
        return self.features[i], self.ids[i]


def join_pairs(examples: list[tuple[Tensor, list[int]]], space_id: int) -> list[tuple[Tensor, list[int]]]:
    """Examples ``(features (F, M), ids)`` joined two by two: ``2i`` then ``2i + 1``, features end to end and ids
    with ``space_id`` between (an odd last one is kept alone). A batch of similar lengths joined this way costs
    what it cost before, with utterances twice as long."""
    out = []
    for i in range(0, len(examples) - 1, 2):
        (f1, i1), (f2, i2) = examples[i], examples[i + 1]
        out.append((torch.cat([f1, f2]), [*i1, space_id, *i2]))
    return out + list(examples[len(examples) // 2 * 2:])


def decoding_options(options: SpeechOptions, **given) -> dict[str, Any]:
    """:func:`transcribe_batch`'s length limits from ``options`` (``window``, ``max_rate``, ``eos_threshold``,
    ``length_penalty``), each replaced by its value in ``given`` unless that is None. The run's window applies to
    location-aware LAS without a CTC head only (measured: it helps there on long utterances; the hybrid's attention
    is less sharp, and windowed it did worse)."""
    windowed = options.model == "las" and options.score == "location" and not options.ctc_weight
    out = {"window": options.window if windowed else (), "max_rate": options.max_rate,
           "eos_threshold": options.eos_threshold, "length_penalty": options.length_penalty}
    out.update({k: v for k, v in given.items() if v is not None})
    return out


def evaluate_transcripts(model: nn.Module, tokenizer, features: list[Tensor], references: list[str],
                         options: SpeechOptions, *, beam: int, max_len: int, ctc_weight: float = 0.0,
                         **limits: Any) -> dict[str, float]:
    """Speech's metric, for the trainer and the predictor alike: WER and CER (%, ``jiwer``), exact match and the
    count of ``model`` transcribing ``features`` against ``references``; ``limits`` replace the run's decoding
    limits (:func:`decoding_options`)."""
    device = next(model.parameters()).device
    hyps = transcribe_batch(model, tokenizer, [f.to(device) for f in features], beam=beam, max_len=max_len,
                            ctc_weight=ctc_weight, **decoding_options(options, **limits))
    return speech_metrics([h.text for h in hyps], references)


#: at most this many of a corpus's unspoken sentences are kept with a run (for its word model: Tatoeba's English
#: gives 105,715, 3.6 MB)
MAX_KEPT_TEXTS = 500_000


class SpeechTask(ApplicationTask, name="speech", unit="chars", options=SpeechOptions, load_data=load_data,
                 model_spec=model_spec, assets=("tokenizer",)):
    """Label-smoothed cross-entropy of the attention decoder, plus (hybrid) or alone (CTC) the CTC loss; metrics:
    character and word error rates (:func:`evaluate_transcripts`). The training transcripts are kept with the run
    (``assets/transcripts.json``), and a generated corpus's sentences that no split speaks (``assets/texts.json``):
    the text of the word model that decodes with it (:mod:`qkv.apps.speech.words`)."""

    json_assets = ("transcripts", "texts")

    def __init__(self, options: SpeechOptions, data=None):
        super().__init__(options, data)
        self.tokenizer = speech_tokenizer()
        self.transcripts: list[str] | None = None
        self.texts: list[str] | None = None
        self._train: _Examples | None = None
        self._batches = 0  # training batches collated (--concat-from)
        self._eval: dict[str, tuple[list[Tensor], list[str]]] = {}

    def setup(self) -> None:
        self.read_data()
        logger.info("data %s: %s", self.options.data, ", ".join(f"{len(u)} {s}" for s, u in self.data.splits.items()))
        train = self.data.splits["train"]
        feats, kept, _ = read_features(train, self.options.n_mels, self.options.on_error)
        if not feats:
            raise ValueError(f"{self.options.data}: no training utterance could be read")
        self._train = _Examples(feats, [self.tokenizer.encode(train[i].text) for i in kept])
        self.transcripts = [train[i].text for i in kept]
        self.texts = list(self.data.texts[:MAX_KEPT_TEXTS]) or None  # the source's order is a seeded shuffle

    def train_examples(self):
        return self._train

    def lengths(self):
        return [f.shape[0] for f in self._train.features]

    def collate(self, examples):
        from ...data import BOS_ID, EOS_ID, pad_sequences
        from .audio import spec_augment, warp_features

        self._batches += 1
        o = self.options
        if o.concat and self._batches > o.concat_from and len(examples) > 1 and float(torch.rand(())) < o.concat:
            examples = join_pairs(examples, self.tokenizer.encode(" ")[0])  # training batches only
        feats = [f.float() for f, _ in examples]
        if o.warp:
            factors = 1 + o.warp * (2 * torch.rand(len(feats), 2) - 1)
            feats = [warp_features(f, float(t), float(m)) for f, (t, m) in zip(feats, factors, strict=True)]
        if self.options.spec_augment:
            feats = [spec_augment(f, freq_width=min(8, self.options.n_mels // 5)) for f in feats]
        x, lengths = pad_features(feats)
        ids = [i for _, i in examples]
        tgt_in, _, _ = pad_sequences([[BOS_ID] + i for i in ids])
        tgt_out, _, mask = pad_sequences([i + [EOS_ID] for i in ids])
        return {"features": x, "lengths": lengths, "tgt_in": tgt_in, "tgt_out": tgt_out, "mask": mask,
                "targets": torch.tensor([t for i in ids for t in i], dtype=torch.long),
                "target_lengths": torch.tensor([len(i) for i in ids])}

    def sizes(self) -> dict[str, Any]:
        return {"vocab_size": self.tokenizer.vocab_size, "n_mels": self.options.n_mels}

    def loss(self, model, batch):
        o = self.options
        out = model(batch["features"], batch["lengths"], batch["tgt_in"])
        mask = batch["mask"]
        loss = torch.zeros((), device=mask.device)
        stats: dict[str, Any] = {}
        weight = 1.0 if o.model == "ctc" else o.ctc_weight
        if out.logits is not None:
            ce = F.cross_entropy(out.logits.float().transpose(1, 2), batch["tgt_out"], ignore_index=0,
                                 reduction="sum", label_smoothing=o.label_smoothing)
            loss = loss + (1.0 - weight) * ce
            stats["token_acc"] = ((out.logits.argmax(-1) == batch["tgt_out"]) & mask).sum()
            if out.attention is not None:
                stats.update(alignment_stats(out.attention, mask))
                if o.guided and self._batches <= o.guided_until:  # a prior for the diagonal, early in training
                    guided = guided_attention_loss(out.attention.float(), mask, out.lengths)
                    loss = loss + o.guided * guided
                    stats["guided"] = guided.detach()
        if out.ctc_logits is not None and weight > 0:
            log_probs = torch.log_softmax(out.ctc_logits.float(), -1).transpose(0, 1)  # (S, B, V)
            ctc = F.ctc_loss(log_probs, batch["targets"], out.lengths, batch["target_lengths"], blank=0,
                             reduction="sum", zero_infinity=True)
            loss = loss + weight * ctc
            stats["ctc_loss"] = ctc.detach()
        return loss, mask.sum(), stats

    def callbacks(self, config) -> list:
        """The check that the attention has aligned by a third of the budget (attention models)."""
        if self.options.model == "ctc":
            return []
        steps = -(-len(self._train) // config.batch_size) if self._train is not None else 1
        self.alignment = AlignmentCheck(config, steps, advice=ALIGN_ADVICE)  # its verdict: .aligned
        return [self.alignment]

    def eval_split(self, split: str) -> tuple[list[Tensor], list[str]]:
        """Features and transcripts of the first ``eval_max`` utterances of ``split`` (read once)."""
        if split not in self._eval:
            part = self.data.split(split)[: self.options.eval_max]
            feats, kept, _ = read_features(part, self.options.n_mels, self.options.on_error)
            self._eval[split] = (feats, [part[i].text for i in kept])
        return self._eval[split]

    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in self.data.splits:
            raise ValueError(f"no split {split!r} ({', '.join(self.data.splits)})")
        feats, refs = self.eval_split(split)
        if not feats:
            raise ValueError(f"no utterance of the {split} split could be read")
        return evaluate_transcripts(model, self.tokenizer, feats, refs, self.options, beam=self.options.eval_beam,
                                    max_len=self.options.max_decode_len)
