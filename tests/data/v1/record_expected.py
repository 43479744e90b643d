import json, torch
torch.set_num_threads(1)
from qkv.tasks import translate, sentiment, images
out = {}
texts = ["7 mars 2019", "2019年3月7日", "Thursday, March 7, 2019", "12/31/1999"]
for kind in ("bahdanau", "transformer"):
    model, s, t, _ = translate._load(f"tests/data/v1/translate-{kind}", "cpu")
    for beam in (1, 3):
        res = translate.translate_texts(model, s, t, texts, beam=beam, max_len=20)
        out[f"translate-{kind}-beam{beam}"] = [{"text": r["text"], "score": float(r["score"]), "attention": r["attention"].tolist()} for r in res]
stexts = ["a wonderful moving story.", "the plot is dull and clumsy.", "an actor", "Brilliant!"]
for kind in ("bigru", "transformer"):
    clf = sentiment.SentimentClassifier.load(f"tests/data/v1/sentiment-{kind}")
    out[f"sentiment-{kind}"] = [{"label": p.label, "probabilities": p.probabilities, "tokens": p.tokens, "weights": p.weights} for p in clf.predict(stexts)]
from qkv.train import load_model
model, ckpt = load_model("tests/data/v1/images-cbam", images.build_model)
opts = images.ImageOptions(**ckpt.config["options"])
x, y = images.load_image_data(opts).splits["test"]
idx = [0, 5, 17, 42]
xin = images.normalize(x[idx], ckpt.config["mean"], ckpt.config["std"])
with torch.no_grad():
    logits, maps = model(xin, return_attention=True)
out["images-cbam"] = {"test_index": idx, "logits": logits.tolist(), "spatial_stage3": maps["stage3"].spatial.tolist()}
json.dump(out, open("tests/data/v1/expected.json", "w"))
# resnet parameter names and shapes (cifar stem, SE) for the stem= argument
m = images.build_model({"arch": "resnet18", "attn": "se", "attn_kwargs": {}, "num_classes": 10, "in_channels": 1, "stem": "cifar"})
json.dump({k: list(v.shape) for k, v in m.state_dict().items()}, open("tests/data/v1/resnet18-se-cifar-shapes.json", "w"))
print(out["translate-bahdanau-beam1"][0]["text"], out["sentiment-bigru"][0]["label"], list(maps))
