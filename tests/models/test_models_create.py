"""qkv.models.create builds every model from JSON-able keyword arguments; qkv.train.upgrade.upgrade_state_dict loads the
runs written by qkv 0.1.0 (tests/fixtures/v1) into today's models, which give the outputs 0.1.0 recorded."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from qkv.data.tokenize import load_tokenizer
from qkv.models import (
    BahdanauSeq2Seq,
    BigramAttentionClassifier,
    FixedContextSeq2Seq,
    LuongSeq2Seq,
    RNNClassifier,
    RNNConfig,
    SmallCNN,
    TransformerClassifier,
    TransformerConfig,
    TransformerSeq2Seq,
    beam_search,
    create,
    create_resnet,
    list_models,
    sknet50,
)
from qkv.models.bisenet import FCN, BiSeNet
from qkv.models.captioning import FixedCaptioner, HardCaptioner, SoftCaptioner, TransformerCaptioner
from qkv.models.lm import CausalLM, LMConfig
from qkv.models.lm_classifier import LMClassifier
from qkv.models.pointer import PointerGenerator, TransformerPointer
from qkv.models.reading import AttentiveReader, BiDAFReader, TransformerReader
from qkv.models.speech import LAS, CTCModel
from qkv.models.speech_transformer import SpeechTransformer
from qkv.train.upgrade import RENAMES, upgrade_state_dict
from tests import FIXTURES

V1 = FIXTURES / "v1"

# small, JSON-able configs for every name, and the direct constructor they must equal
RNN = {"src_vocab": 11, "tgt_vocab": 13, "embed_dim": 8, "hidden_dim": 12, "attn_dim": 6}
TRANSFORMER = {"src_vocab": 11, "tgt_vocab": 13, "dim": 16, "num_heads": 2, "ffn_dim": 24, "num_layers": 1,
               "num_decoder_layers": 2, "positions": "learned", "max_len": 20}
CLASSIFIER = {"vocab_size": 30, "num_classes": 3, "embed_dim": 8}
LM_BODY = {"vocab_size": 30, "dim": 16, "num_heads": 2, "num_layers": 2, "max_len": 12}
CASES = {
    "fixed": (RNN, lambda: FixedContextSeq2Seq(RNNConfig(**RNN))),
    "bahdanau": ({**RNN, "num_layers": 2}, lambda: BahdanauSeq2Seq(RNNConfig(**RNN, num_layers=2))),
    "luong": ({**RNN, "score": "general"}, lambda: LuongSeq2Seq(RNNConfig(**RNN, score="general"))),
    "transformer": (TRANSFORMER, lambda: TransformerSeq2Seq(TransformerConfig(**TRANSFORMER))),
    "bigru-classifier": ({**CLASSIFIER, "hidden_dim": 10}, lambda: RNNClassifier(30, 3, embed_dim=8, hidden_dim=10)),
    "bilstm-classifier": ({**CLASSIFIER, "hops": 2},
                          lambda: RNNClassifier(30, 3, embed_dim=8, cell="lstm", hops=2)),
    "transformer-classifier": ({**CLASSIFIER, "dim": 16, "num_heads": 2, "pooling": "attention"},
                               lambda: TransformerClassifier(30, 3, embed_dim=8, dim=16, num_heads=2,
                                                             pooling="attention")),
    "bigram-classifier": ({**CLASSIFIER, "buckets": 50, "hidden_dim": 6},
                          lambda: BigramAttentionClassifier(30, 3, embed_dim=8, buckets=50, hidden_dim=6)),
    "small-cnn": ({"widths": [4, 8], "convs": [1, 1], "attn": "cbam", "attn_kwargs": {"reduction": 2}},
                  lambda: SmallCNN(widths=(4, 8), convs=(1, 1), attn="cbam", attn_kwargs={"reduction": 2})),
    **{name: ({"num_classes": 5, "in_channels": 1, "attn": "cbam", "stem": "cifar"},
              lambda name=name: create_resnet(name, num_classes=5, in_channels=1, attn="cbam", stem="cifar"))
       for name in ("resnet18", "resnet34", "resnet50", "resnet101")},
    "sknet50": ({"num_classes": 5, "attn_kwargs": {"reduction": 8}},
                lambda: sknet50(num_classes=5, attn_kwargs={"reduction": 8})),
    "lm-classifier": ({"lm": LM_BODY, "num_classes": 3, "bos_id": 2, "hops": 2},
                      lambda: LMClassifier(LM_BODY, 3, bos_id=2, hops=2)),
    "lm": ({"vocab_size": 30, "dim": 16, "num_heads": 2, "num_layers": 1, "kv_heads": 1, "max_len": 12},
           lambda: CausalLM(LMConfig(vocab_size=30, dim=16, num_heads=2, num_layers=1, kv_heads=1, max_len=12))),
    **{name: (cfg, lambda cls=cls, cfg=cfg: cls(**cfg)) for name, cls, cfg in (
        ("caption-soft", SoftCaptioner, {"vocab_size": 20, "widths": [4, 4, 4, 8], "embed_dim": 8, "hidden_dim": 12}),
        ("caption-hard", HardCaptioner, {"vocab_size": 20, "widths": [4, 4, 4, 8], "attn_dim": 6,
                                         "test_attention": "argmax"}),
        ("caption-fixed", FixedCaptioner, {"vocab_size": 20, "in_channels": 3, "widths": [4, 4, 4, 8]}),
        ("caption-transformer", TransformerCaptioner, {"vocab_size": 20, "widths": [4, 4, 4, 8], "dim": 16,
                                                       "num_heads": 2, "num_layers": 1}),
        ("attentive-reader", AttentiveReader, {"vocab_size": 30, "embed_dim": 8, "hidden_dim": 12}),
        ("bidaf-reader", BiDAFReader, {"vocab_size": 30, "embed_dim": 8, "hidden_dim": 12, "score": "additive"}),
        ("transformer-reader", TransformerReader, {"vocab_size": 30, "dim": 16, "num_heads": 2, "num_layers": 1}),
        ("speech-las", LAS, {"vocab_size": 12, "n_mels": 8, "hidden_dim": 8, "num_layers": 3, "decoder_dim": 12,
                             "attn_dim": 6, "score": "location", "filters": 2, "kernel_size": 3, "ctc": True}),
        ("speech-ctc", CTCModel, {"vocab_size": 12, "n_mels": 8, "hidden_dim": 8, "num_layers": 3}),
        ("speech-transformer", SpeechTransformer, {"vocab_size": 12, "n_mels": 8, "dim": 16, "num_heads": 2}),
        ("bisenet", BiSeNet, {"num_classes": 3, "in_channels": 1, "widths": [4, 8, 8, 16]}),
        ("fcn", FCN, {"num_classes": 3, "in_channels": 1, "widths": [4, 8, 8, 16]}),
        ("lm", lambda **cfg: CausalLM(LMConfig(**cfg)), {"vocab_size": 30, "dim": 16, "num_heads": 2, "num_layers": 1,
                                                           "positions": "alibi"}),
        ("pointer", PointerGenerator, {"vocab": 20, "embed_dim": 8, "hidden_dim": 12, "attn_dim": 6}),
        ("transformer-pointer", TransformerPointer, {"vocab": 20, "dim": 16, "num_heads": 2, "ffn_dim": 24,
                                                     "num_layers": 1}),
    )},
}


def test_every_name_has_a_case():
    assert sorted(CASES) == sorted(list_models())


@pytest.mark.parametrize("name", list(CASES))
def test_create_equals_the_direct_constructor(name):
    config, direct = CASES[name]
    config = json.loads(json.dumps(config))  # what a checkpoint's config.json gives back
    with torch.device("meta"):
        model, want = create(name, **config), direct()
    assert type(model) is type(want)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in want.state_dict().items()}
    assert upgrade_state_dict(name, model.state_dict()).keys() == model.state_dict().keys()  # new names pass


def test_classifier_names_fix_the_cell():
    assert isinstance(create("bilstm-classifier", vocab_size=9, num_classes=2).rnn, torch.nn.LSTM)
    assert isinstance(create("bigru-classifier", vocab_size=9, num_classes=2).rnn, torch.nn.GRU)


@pytest.mark.parametrize("name, config, keyword", [
    ("transformer", {"src_vocab": 5, "tgt_vocab": 5, "d_model": 8}, "d_model"),
    ("bahdanau", {"src_vocab": 5, "tgt_vocab": 5, "layers": 2}, "layers"),
    ("bigru-classifier", {"vocab_size": 5, "num_classes": 2, "rnn": "gru"}, "rnn"),
    ("bigru-classifier", {"vocab_size": 5, "num_classes": 2, "cell": "lstm"}, "cell"),
    ("transformer-classifier", {"vocab_size": 5, "num_classes": 2, "ff_dim": 8}, "ff_dim"),
    ("resnet18", {"num_classes": 5, "width": 3}, "width"),
    ("sknet50", {"attn": "se"}, "attn"),
    ("small-cnn", {"stem": "cifar"}, "stem"),
])
def test_unknown_keyword_names_the_keyword_and_the_model(name, config, keyword):
    with pytest.raises(ValueError, match=rf"model '{name}' does not take .*\b{keyword}\b"):
        create(name, **config)


@pytest.mark.parametrize("name, config, match", [
    ("transformer", {"src_vocab": 5, "tgt_vocab": 5, "dim": 30, "num_heads": 4}, "num_heads"),
    ("bahdanau", {"src_vocab": 5}, "tgt_vocab"),  # a missing argument: a ValueError too, not a TypeError
    ("bilstm-classifier", {"vocab_size": 5, "num_classes": 2, "hidden_dim": 7}, "hidden_dim"),
    ("resnet50", {"stem": "tiny"}, "stem"),
])
def test_invalid_values_raise_value_errors_naming_the_model(name, config, match):
    with pytest.raises(ValueError, match=rf"model '{name}'.*{match}"):
        create(name, **config)


def test_unknown_model_lists_the_names():
    with pytest.raises(ValueError, match="unknown model 'gpt'.*bahdanau.*transformer-classifier.*sknet50"):
        create("gpt")
    with pytest.raises(ValueError, match="unknown model"):
        upgrade_state_dict("gpt", {})


# ----------------------------------------------------------------------------------- 0.1.0's parameter names


def test_renames_written_out():
    """Old names, as qkv 0.1.0's modules called them, for the models without a v1 run in tests/fixtures."""
    t = torch.zeros(1)
    old = ["src_pos.weight", "tgt_pos.weight", "encoder.0.norm1.weight", "encoder.0.self_attn.q_proj.weight",
           "encoder.0.norm2.bias", "encoder.0.ffn.fc1.weight", "decoder.1.norm1.weight", "decoder.1.norm2.weight",
           "decoder.1.cross_attn.k_proj.bias", "decoder.1.norm3.bias", "decoder.1.ffn.fc2.weight", "out.weight"]
    new = ["src_pos.table.weight", "tgt_pos.table.weight", "encoder.0.attn_norm.weight",
           "encoder.0.self_attn.q_proj.weight", "encoder.0.ffn_norm.bias", "encoder.0.ffn.fc1.weight",
           "decoder.1.attn_norm.weight", "decoder.1.cross_norm.weight", "decoder.1.cross_attn.k_proj.bias",
           "decoder.1.ffn_norm.bias", "decoder.1.ffn.fc2.weight", "out.weight"]
    assert list(upgrade_state_dict("transformer", dict.fromkeys(old, t))) == new
    old = ["layers.0.norm1.weight", "layers.0.attn.out_proj.bias", "layers.1.norm2.bias", "layers.1.ff.0.weight",
           "layers.1.ff.3.bias", "norm.weight", "cls", "pool.key_proj.weight"]
    new = ["layers.0.attn_norm.weight", "layers.0.self_attn.out_proj.bias", "layers.1.ffn_norm.bias",
           "layers.1.ffn.fc1.weight", "layers.1.ffn.fc2.bias", "norm.weight", "cls", "pool.key_proj.weight"]
    assert list(upgrade_state_dict("transformer-classifier", dict.fromkeys(old, t))) == new
    old = ["layer1.0.attn.channel.mlp.0.weight", "layer1.0.attn.channel.mlp.2.bias",
           "layer1.0.attn.spatial.conv.weight", "layer2.1.attn.mlp.0.bias", "fc.weight"]
    new = ["layer1.0.attn.channel.fc1.weight", "layer1.0.attn.channel.fc2.bias",
           "layer1.0.attn.spatial.conv.weight", "layer2.1.attn.fc1.bias", "fc.weight"]
    for name in ("resnet18", "resnet101", "sknet50", "small-cnn"):
        assert list(upgrade_state_dict(name, dict.fromkeys(old, t))) == new
    assert set(RENAMES) <= set(list_models())


def test_an_old_cbam_resnet_loads_strictly():
    """ResNet-18 with CBAM (and one with CBAM's channel gate alone), keys renamed back to 0.1.0's by hand."""
    for attn in ("cbam", "cbam_channel"):
        model = create("resnet18", num_classes=4, attn=attn, stem="cifar")
        state = model.state_dict()
        old = {k.replace(".fc1.", ".mlp.0.").replace(".fc2.", ".mlp.2.") if ".attn." in k else k: v
               for k, v in state.items()}
        assert sum(".mlp.0." in k for k in old) == 16  # weight and bias in each of the 8 blocks
        fresh = create("resnet18", num_classes=4, attn=attn, stem="cifar")
        fresh.load_state_dict(upgrade_state_dict("resnet18", old), strict=True)
        assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), state.values(), strict=True))


def load_v1(run: str) -> tuple[dict, dict]:
    """A v1 run's ``best/``: the state dict (tied weights restored from the ``qkv.aliases`` metadata) and config."""
    best = V1 / run / "best"
    with safe_open(str(best / "model.safetensors"), framework="pt") as f:
        aliases = json.loads((f.metadata() or {}).get("qkv.aliases", "{}"))
    state = load_file(str(best / "model.safetensors"))
    state.update({name: state[target] for name, target in aliases.items()})
    return state, json.loads((best / "config.json").read_text())["config"]


def model_from_v1(run: str):
    """The run's model, built by ``create`` from its 0.1.0 config mapped by hand, with the upgraded weights."""
    state, config = load_v1(run)
    arch = config.get("arch")
    if run == "translate-bahdanau":
        name, kwargs = "bahdanau", {**{k: v for k, v in arch.items() if k != "layers"}, "num_layers": arch["layers"]}
    elif run == "translate-transformer":
        name = "transformer"
        kwargs = {"src_vocab": arch["src_vocab"], "tgt_vocab": arch["tgt_vocab"], "dim": arch["d_model"],
                  "num_heads": arch["heads"], "ffn_dim": arch["ffn_dim"], "num_layers": arch["encoder_layers"],
                  "num_decoder_layers": arch["decoder_layers"], "dropout": arch["dropout"], "score": arch["score"]}
    elif run == "sentiment-bigru":  # 0.1.0's hidden_dim was one direction's size
        name = "bigru-classifier"
        kwargs = {**arch, "hidden_dim": 2 * arch["hidden_dim"], "vocab_size": config["vocab_size"],
                  "num_classes": config["num_classes"]}
    elif run == "sentiment-transformer":
        name = "transformer-classifier"
        kwargs = {**arch, "vocab_size": config["vocab_size"], "num_classes": config["num_classes"]}
    else:
        name = "small-cnn"
        kwargs = {k: config[k] for k in ("num_classes", "in_channels", "widths", "attn", "attn_kwargs", "dropout")}
    model = create(name, **kwargs).eval()
    model.load_state_dict(upgrade_state_dict(name, state), strict=True)
    return model


@pytest.fixture(scope="module")
def expected():
    return json.loads((V1 / "expected.json").read_text())


@pytest.mark.parametrize("run", ["translate-bahdanau", "translate-transformer", "sentiment-bigru",
                                 "sentiment-transformer", "images-cbam"])
def test_v1_runs_load_strictly(run):
    model_from_v1(run)


def right_padded(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(x) for x in ids)
    mask = torch.tensor([[i < len(x) for i in range(n)] for x in ids])
    return torch.tensor([x + [0] * (n - len(x)) for x in ids]), mask


@pytest.mark.parametrize("kind, beams", [("transformer", (1, 3)), ("bahdanau", (1,))])
def test_v1_translations_are_unchanged(kind, beams, expected):
    """0.1.0's ``translate_texts``: sources encoded without BOS/EOS, beam search to 20 tokens, alpha 0.6."""
    model = model_from_v1(f"translate-{kind}")
    assets = V1 / f"translate-{kind}" / "best" / "assets"
    src_tok, tgt_tok = load_tokenizer(assets / "src_tokenizer"), load_tokenizer(assets / "tgt_tokenizer")
    texts = ["7 mars 2019", "2019年3月7日", "Thursday, March 7, 2019", "12/31/1999"]
    ids = [src_tok.encode(t) for t in texts]
    src, mask = right_padded(ids)
    for beam in beams:
        hyps = beam_search(model, src, mask, beam=beam, max_len=20, length_penalty=0.6)
        for h, n, want in zip(hyps, map(len, ids), expected[f"translate-{kind}-beam{beam}"], strict=True):
            assert tgt_tok.decode(h.tokens) == want["text"]
            assert h.score == pytest.approx(want["score"], abs=1e-4)
            torch.testing.assert_close(h.attention[:, :n], torch.tensor(want["attention"]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["bigru", "transformer"])
def test_v1_sentiment_predictions_are_unchanged(kind, expected):
    """Probabilities and word weights as 0.1.0 predicted them (its sinusoids were float32: ~1e-7 apart)."""
    model = model_from_v1(f"sentiment-{kind}")
    tok = load_tokenizer(V1 / f"sentiment-{kind}" / "best" / "assets" / "tokenizer")
    texts = ["a wonderful moving story.", "the plot is dull and clumsy.", "an actor", "Brilliant!"]
    ids, mask = right_padded(tok.encode_batch(texts))
    with torch.no_grad():
        out = model(ids, mask)
    probs = out.logits.softmax(-1)
    for i, want in enumerate(expected[f"sentiment-{kind}"]):
        assert probs[i].tolist() == pytest.approx([want["probabilities"]["negative"],
                                                   want["probabilities"]["positive"]], abs=1e-5)
        n = len(want["weights"])
        torch.testing.assert_close(out.weights[i, :n], torch.tensor(want["weights"]), atol=1e-5, rtol=0)
