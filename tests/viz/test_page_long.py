"""Long inputs on the attention page: past the byte budget, large records keep each row's top k weights (exactly
those, rounded to 1/255) with a downsampled overview, the page says so, and small records stay whole."""

import base64
import json
import re

import torch

import qkv
from qkv.viz.page import SPARSE_CELLS, attention_page


def _data(text):
    return json.loads(re.search(r'id="qkv-data">(.*?)</script>', text, re.S).group(1))


def test_large_records_keep_each_rows_top_k(gen):
    t = 300
    w = torch.softmax(torch.randn(1, 3, t, t, generator=gen) * 3, -1)
    small = torch.softmax(torch.randn(1, 2, 10, 10, generator=gen), -1)
    records = [qkv.AttentionRecord("enc.0.attn", "A", "self", 0, w), qkv.AttentionRecord("x.attn", "A", "cross", None,
                                                                                        small)]
    budget = 3 * t * 8 * 3 + 300  # room for k = 8
    text = attention_page(records, tokens=[f"w{i}" for i in range(t)], budget=budget, rollout=False)
    data = _data(text)
    big, little = data["records"]
    assert t * t > SPARSE_CELLS and "data" not in big and big["sparse"]["k"] == 8
    sp = big["sparse"]
    idx = torch.frombuffer(bytearray(base64.b64decode(sp["idx"])), dtype=torch.int16).to(torch.int64) % 65536
    val = torch.frombuffer(bytearray(base64.b64decode(sp["val"])), dtype=torch.uint8).float() / 255
    idx, val = idx.view(3, t, sp["k"]), val.view(3, t, sp["k"])
    want = torch.topk(w[0], sp["k"], dim=-1)
    assert torch.equal(idx.sort(-1).values, want.indices.sort(-1).values)  # exactly each row's k largest
    got = torch.gather(w[0], -1, idx)
    assert (got - val).abs().max() <= 0.5 / 255 + 1e-6
    assert abs(sp["kept"] - want.values.sum(-1).mean().item()) < 1e-3
    ov = big["overview"]
    assert ov["h"] == min(t, 192) and len(ov["max"]) == 3
    assert "data" in little and "sparse" not in little  # small records stay whole
    assert any("largest weights" in n for n in data["notes"])


def test_under_the_budget_every_record_is_dense(gen):
    w = torch.softmax(torch.randn(1, 2, 300, 300, generator=gen), -1)
    data = _data(attention_page([qkv.AttentionRecord("a.0.attn", "A", "self", 0, w)], rollout=False))
    assert "data" in data["records"][0] and not any("largest" in n for n in data["notes"])


def test_the_statistics_of_every_head_are_on_the_page(gen):
    w = torch.softmax(torch.randn(1, 4, 6, 6, generator=gen), -1)
    data = _data(attention_page([qkv.AttentionRecord("a.0.attn", "A", "self", 0, w)], tokens=list("abcabc")))
    stats = data["records"][0]["stats"]
    assert set(stats) == set(data["statistics"]) and all(len(v) == 4 for v in stats.values())
    want = qkv.viz.head_stats.head_statistics(w[0], list("abcabc"))
    for k, v in stats.items():
        assert v == [round(float(x), 4) for x in want[k]]
