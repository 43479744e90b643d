# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Attention in a notebook
#
# `qkv.notebook.show` returns the attention page of a model on an input as an object that the notebook draws
# inline: every attention module, layer and head, with the lines, matrix and rollout views of `qkv view`. The page
# is self-contained (no CDN: it works offline and in VS Code) and `.save(path)` writes it as a file.
#
# We build a small model from qkv's layers: an embedding, two Transformer layers and attention pooling.

# %%
import torch
from torch import nn

import qkv
from qkv.layers import TransformerLayer
from qkv.notebook import show

torch.manual_seed(0)


class Tiny(nn.Module):
    def __init__(self, vocab: int = 100, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerLayer(dim, 4) for _ in range(2))
        self.pool = qkv.AttentionPooling(dim)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.pool(x)


model = Tiny().eval()
words = ["the", "cat", "sat", "on", "the", "mat"]
ids = torch.arange(len(words))[None]

# %% [markdown]
# `show(model, *inputs, tokens=...)` runs the model once on its inputs inside `qkv.capture_attention` and labels
# the sequence axes with the tokens. The last expression of a cell is drawn:

# %%
page = show(model, ids, tokens=words, title="a tiny model")
page

# %% [markdown]
# The same object saves the page, to open in a browser or attach to a report:

# %%
path = page.save("tiny-attention.html")
print(path, f"{path.stat().st_size / 1e3:.0f} kB")

# %% [markdown]
# A trained run is `show("runs/demo", "7 mars 2019")` (any application: a text, or `image=`, `index=`,
# `question=`), and a saved Hugging Face model directory is `show("my-bert", "the cat sat on the mat")`.
