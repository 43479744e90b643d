"""Captioning's data, model and the trainer's task: :func:`load_data`, :func:`model_spec` and :class:`CaptionTask`
(its metric: :func:`~qkv.apps.caption.decode.evaluate_captions`)."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import ApplicationTask
from .data import CaptionData, CaptionExamples, load_caption_data
from .decode import evaluate_captions
from .options import CaptionOptions

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "CaptionTask"]


def load_data(options: CaptionOptions) -> CaptionData:
    """The train/valid/test splits ``options`` describe (every split must hold an image)."""
    o = options
    return load_caption_data(o.data, images=o.images, on_error=o.on_error, image_size=o.image_size, grey=o.grey,
                             valid=o.valid, test=o.test, n_train=o.n_train, n_valid=o.n_valid, n_test=o.n_test,
                             scenes_root=o.scenes_root, seed=o.data_seed)


def model_spec(options: CaptionOptions, *, vocab_size: int, in_channels: int, image_size: int,
               content_ids: list[int] | None = None) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`; ``content_ids``: token ids of the item words
    (``deep_output="context"``)."""
    o = options
    config: dict[str, Any] = {"vocab_size": vocab_size, "in_channels": in_channels, "widths": list(o.widths),
                              "dropout": o.dropout, "coords": o.coords, "padding": o.padding}
    if o.model == "transformer":
        config.update(dim=o.dim, num_heads=o.num_heads, ffn_dim=o.ffn_dim, num_layers=o.num_layers,
                      score=o.score_name, max_len=o.max_decode_len + 2, grid=(image_size // 8) ** 2)
    else:
        config.update(embed_dim=o.embed_dim, hidden_dim=o.hidden_dim)
        if o.model != "fixed":
            config.update(attn_dim=o.attn_dim, score=o.score_name, where=o.where, deep_output=o.deep_output,
                          keys=o.keys, init_state=o.init_state, glimpse=o.glimpse, salience=o.salience,
                          glimpse_features=o.glimpse_features)
            if o.deep_output != "full":
                if not content_ids:
                    raise ValueError(f"deep_output {o.deep_output!r} needs the item words' ids (captions data "
                                     "with items)")
                config["content_ids"] = list(content_ids)
            if o.naming:
                config["naming"] = True
        if o.model == "hard":
            config.update(test_attention=o.hard_test, expected_share=o.hard_expected)
    return {"name": f"caption-{o.model}", "config": config}


class CaptionTask(ApplicationTask, name="caption", unit="words", options=CaptionOptions, load_data=load_data,
                  model_spec=model_spec, assets=("tokenizer",)):
    """Teacher-forced cross-entropy over caption words (one reference of each image drawn per batch), plus the
    doubly stochastic penalty (soft) or the REINFORCE terms (hard); metrics from :func:`caption_metrics`."""

    def setup(self) -> None:
        from ...data import train_tokenizer

        self.read_data()
        logger.info("data %s: %s", self.options.data,
                    ", ".join(f"{len(s)} {name}" for name, s in self.data.splits.items()))
        if self.tokenizer is None:
            texts = (c for refs in self.data.splits["train"].references for c in refs)
            self.tokenizer = train_tokenizer("word", texts, min_freq=1 if self.options.data == "scenes"
                                             else self.options.min_freq)

    def train_examples(self):
        return CaptionExamples(self.data.splits["train"], self.tokenizer, self.options.max_decode_len)

    def collate(self, examples):
        from ...data import BOS_ID, EOS_ID, pad_sequences

        images = torch.stack([x for x, _ in examples])
        if self.options.references == "best":  # every reference; the loss keeps each image's most likely one
            picks = [ids for _, refs in examples for ids in refs]
            owner = torch.tensor([i for i, (_, refs) in enumerate(examples) for _ in refs])
        else:  # one reference per image, drawn at random
            picks = [refs[int(torch.randint(len(refs), ()))] for _, refs in examples]
            owner = torch.arange(len(examples))
        tgt_in, _, _ = pad_sequences([[BOS_ID] + ids for ids in picks])
        tgt_out, _, mask = pad_sequences([ids + [EOS_ID] for ids in picks])
        return {"images": images, "tgt_in": tgt_in, "tgt_out": tgt_out, "mask": mask, "owner": owner}

    def sizes(self) -> dict[str, Any]:
        ids = [self.tokenizer.encode(w) for w in self.data.item_words]
        return {"vocab_size": self.tokenizer.vocab_size, "in_channels": self.data.channels,
                "image_size": self.data.image_size, "content_ids": sorted({i[0] for i in ids if len(i) == 1})}

    def run_config(self) -> dict[str, Any]:
        return {"image_size": self.data.image_size, "channels": self.data.channels,
                "item_words": self.data.item_words}

    def loss(self, model, batch):
        o = self.options
        images, tgt_in, target, mask, owner = (batch[k] for k in ("images", "tgt_in", "tgt_out", "mask", "owner"))
        images = images.float() / 255.0
        if len(owner) > len(images):  # references="best": train on each image's reference of least loss now
            with torch.no_grad():
                every = model(images, tgt_in, owner)
                nll = F.cross_entropy(every.logits.float().transpose(1, 2), target, ignore_index=0,
                                      reduction="none", label_smoothing=o.label_smoothing).sum(1)
            keep = _least_per_owner(nll, owner)  # one row per image, in image order
            tgt_in, target, mask = tgt_in[keep], target[keep], mask[keep]
        out = model(images, tgt_in)
        ce = F.cross_entropy(out.logits.float().transpose(1, 2), target, ignore_index=0, reduction="none",
                             label_smoothing=o.label_smoothing)  # (B, T)
        loss = ce.sum()
        stats: dict[str, Any] = {"token_acc": ((out.logits.argmax(-1) == target) & mask).sum()}
        module = getattr(model, "module", model)  # the DDP wrapper's model
        extra, more = module.auxiliary_loss(  # the model's own terms (penalty, REINFORCE), weighted by the options
            out, -ce.detach().sum(1), mask, doubly_stochastic=o.doubly_stochastic or 0.0,
            reward_weight=o.reward_weight, entropy_weight=o.entropy_weight, baseline_decay=o.baseline_decay)
        if extra is not None:
            loss = loss + extra
        if out.naming is not None and o.naming:  # the item words read again from features that see less than one
            items = module.content[target] & mask
            naming = F.cross_entropy(out.naming.float().transpose(1, 2), target, reduction="none")[items].sum()
            loss = loss + o.naming * naming
            more = {**more, "naming": naming.detach()}
        return loss, mask.sum(), {**stats, **more}

    def evaluate(self, model, split: str) -> dict[str, float]:
        return evaluate_captions(model, self.tokenizer, self.data, split, limit=self.options.eval_max,
                                 beam=self.options.eval_beam, max_len=self.options.max_decode_len)


def _least_per_owner(loss: Tensor, owner: Tensor) -> Tensor:
    """Indices of the rows of least ``loss (R,)`` per value of ``owner (R,)`` (0..B-1, every value present), in
    owner order: Guzman-Rivera et al.'s multiple choice learning, over an image's references."""
    order = torch.argsort(loss, stable=True)
    first = torch.full((int(owner.max()) + 1,), len(loss), dtype=torch.long, device=loss.device)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=loss.device)
    first.scatter_reduce_(0, owner, rank, reduce="amin")
    return order[first]
