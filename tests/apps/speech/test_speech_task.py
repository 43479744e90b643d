"""Speech recognition end to end: the speller's attention against a float64 formula, the listener's padding, the
decoder's steps against teacher forcing, a tiny model that learns spoken digits, and the command line (train,
transcribe, --evaluate, --plot, view, hostile files)."""

import contextlib
import io
import shutil

import pytest
import torch

pytest.importorskip("soundfile")
pytest.importorskip("librosa")
pytest.importorskip("jiwer")

from qkv.cli import main  # noqa: E402
from qkv.models import create  # noqa: E402
from qkv.models.speech import Listener, SpellerAttention  # noqa: E402

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("flite") is None,
                                  reason="espeak-ng and flite are not installed (make data)")


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("score, smoothing", [("location", False), ("location", True), ("content", False)])
def test_speller_attention_matches_float64_formula(gen, score, smoothing):
    att = SpellerAttention(6, 8, 5, score=score, filters=3, kernel_size=5, beta=2.0,
                           normalize="smooth" if smoothing else "softmax").double()
    q, mem = torch.randn(2, 6, generator=gen, dtype=torch.float64), torch.randn(2, 7, 8, generator=gen,
                                                                                dtype=torch.float64)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    prev = torch.softmax(torch.randn(2, 7, generator=gen, dtype=torch.float64), -1)
    ctx, w = att(q, att.prepare_key(mem), mem, mask, prev)
    s = att.score
    hidden = q @ s.query_proj.weight.T  # W q + V k + b (the bias is the key projection's)
    hidden = hidden[:, None] + mem @ s.key_proj.weight.T + s.key_proj.bias
    if score == "location":  # + U (F * a_prev)
        f = torch.nn.functional.conv1d(prev[:, None], s.conv.weight, padding=2).transpose(1, 2)  # (B, S, filters)
        hidden = hidden + f @ s.location_proj.weight.T
    e = 2.0 * (torch.tanh(hidden) @ s.v.weight[0])  # sharpening beta = 2
    e = e.masked_fill(~mask, float("-inf"))
    want = torch.sigmoid(e) * mask / (torch.sigmoid(e) * mask).sum(-1, keepdim=True) if smoothing else \
        torch.softmax(e, -1)
    torch.testing.assert_close(w, want)
    torch.testing.assert_close(ctx, (want[..., None] * mem).sum(1))


@pytest.mark.parametrize("kind, reduction", [("pyramid", 4), ("conv", 8)])
def test_listener_ignores_padding(gen, kind, reduction):
    listener = Listener(10, 8, 4, kind=kind, reduction=reduction, dropout=0.0).eval()
    x = torch.randn(1, 37, 10, generator=gen)
    alone, n1 = listener(x, torch.tensor([37]))
    padded = torch.cat([x, torch.randn(1, 20, 10, generator=gen) * 5], 1)
    batch, n2 = listener(torch.cat([padded, torch.randn(1, 57, 10, generator=gen)]), torch.tensor([37, 57]))
    assert int(n1) == int(n2[0]) == int(listener.out_lengths(torch.tensor([37]))[0])
    torch.testing.assert_close(batch[0, : int(n1)], alone[0], atol=1e-5, rtol=1e-4)
    assert batch[0, int(n1):].abs().max() == 0  # frames past the length are zeros


@pytest.mark.parametrize("name, kw", [("speech-las", {"score": "location", "ctc": True}),
                                      ("speech-las", {"score": "content", "listener": "conv"}),
                                      ("speech-transformer", {"dim": 16, "num_heads": 2, "num_layers": 1})])
def test_decode_steps_equal_teacher_forcing(gen, name, kw):
    model = create(name, vocab_size=12, n_mels=10, dropout=0.0, **kw).eval()
    x, lengths = torch.randn(2, 40, 10, generator=gen), torch.tensor([40, 29])
    tgt = torch.randint(3, 12, (2, 6), generator=gen)
    with torch.no_grad():
        out = model(x, lengths, tgt)
        state = model.encode(x, lengths)
        for t in range(tgt.shape[1]):
            logits, attn, state = model.decode_step(tgt[:, t], state)
            torch.testing.assert_close(logits, out.logits[:, t], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(attn, out.attention[:, t], atol=1e-5, rtol=1e-4)
    s1 = int(out.lengths[1])
    assert out.attention[1, :, s1:].abs().max() == 0  # no weight on padded frames
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(2, 6))


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    """Four words spoken by two espeak-ng voices at three rates and two pitches (train), and at two other rates
    (test): a corpus a tiny model learns in seconds."""
    from qkv.apps.speech.synth import synthesize
    from qkv.data.speech import SpeechCorpus, Utterance

    root = tmp_path_factory.getbasetemp() / "speech-words"
    root.mkdir(exist_ok=True)

    def make(rates, pitches):
        out = []
        for w in ("one", "two", "three", "four"):
            for voice in ("espeak:en-us", "espeak:en-gb"):
                for r in rates:
                    for p in pitches:
                        path = root / f"{w}-{voice[7:]}-{r}-{p}.wav"
                        if not path.exists():
                            synthesize(w, voice, path, rate=r, pitch=p)
                        out.append(Utterance(str(path), w, voice))
        return out

    test = make((0.95, 1.05), (50,))
    return SpeechCorpus({"train": make((0.9, 1.0, 1.1), (40, 60)), "valid": test, "test": test})


@pytest.mark.slow  # 40 epochs on synthesised words: about 15 s on one core
@needs_espeak
def test_a_tiny_las_learns_spoken_words(words, one_thread):
    from qkv.apps.speech import SpeechOptions, SpeechTask, speech_metrics, train_defaults, transcribe_batch
    from qkv.train import train

    options = SpeechOptions(data="words.tsv", model="las", score="location", listener="conv", num_layers=1,
                            hidden_dim=32, n_mels=20, embed_dim=16, decoder_dim=64, attn_dim=32, dropout=0.0,
                            spec_augment=False, ctc_weight=0.2)
    config = train_defaults(options).replace(epochs=40, batch_size=8, lr=3e-3, warmup_steps=0, progress=False,
                                             eval_split=None, final_splits=(), monitor=None)
    torch.manual_seed(0)
    task = SpeechTask(options, words)
    result = train(task, config)
    feats, refs = task.eval_split("test")
    greedy = transcribe_batch(result.model, task.tokenizer, feats, beam=1)
    # chance: a random word of the four is wrong in 3 of 4 utterances (CER ~60%); learned, nearly none is
    assert speech_metrics([h.text for h in greedy], refs)["cer"] < 15.0
    joint = transcribe_batch(result.model, task.tokenizer, feats, beam=3, ctc_weight=0.3)
    assert speech_metrics([h.text for h in joint], refs)["cer"] < 15.0
    h = greedy[0]
    assert h.attention.shape == (len(h.tokens) + 1, h.ctc.shape[0]) and h.ctc.shape[1] == task.tokenizer.vocab_size
    # the alignment moves forward: the frame of most attention never goes back by more than one
    peaks = h.attention.argmax(-1)
    assert bool((peaks[1:] >= peaks[:-1] - 1).all())
    assert task.alignment.aligned is not None  # the check ran at a third of the epochs (this model aligns about then)


@pytest.fixture(scope="module")
def tiny(tiny_run):
    """The shared tiny speech run (`tests.helpers.TINY_RUNS`) and the cache of its synthesised audio."""
    return tiny_run("speech"), tiny_run.root / "speech-cache"


@needs_espeak
@pytest.mark.slow
def test_cli_train_transcribe_evaluate_plot_view(tiny, tmp_path):
    run_dir, cache = tiny
    clips = sorted((cache / "wav").glob("*.wav"))[:2]
    code, out, err = run(["transcribe", str(run_dir), *map(str, clips), "--beam", "2", "--max-len", "12",
                          "--plot", str(tmp_path / "pics")])
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split("\t")[0] for line in lines[:2]] == [str(c) for c in clips]
    assert all(p.stat().st_size > 1000 for p in (tmp_path / "pics").glob("*.png")) and \
        len(list((tmp_path / "pics").glob("*.png"))) == 2
    code, out, err = run(["transcribe", str(run_dir), "--evaluate", "long", "--max-len", "12"])
    assert code == 0, err
    assert "long: 2 utterances" in out and "WER" in out and "CER" in out
    code, out, err = run(["transcribe", str(run_dir), "--evaluate", "test", "--beam", "2", "--window", "2,8",
                          "--max-rate", "20", "--eos-threshold", "0.5", "--length-penalty", "1"])
    assert code == 0 and "test: 3 utterances, beam 2" in out and "CER" in out, err
    code, out, err = run(["transcribe", str(run_dir), "--evaluate", "test", "--window", ""])  # no window
    assert code == 0 and "CER" in out, err
    code, _, err = run(["transcribe", str(run_dir), "--evaluate", "test", "--window", "3"])
    assert code == 2 and "window" in err
    code, out, err = run(["evaluate", str(run_dir), "--max-len", "12"])
    assert code == 0 and "| cer |" in out, err
    code, out, err = run(["view", str(run_dir), str(clips[0]), "--out", str(tmp_path / "v.html")])
    assert code == 0 and (tmp_path / "v.html").stat().st_size > 1000, err


@needs_espeak
def test_cli_hostile_inputs_are_one_line_errors(tiny, tmp_path):
    run_dir, cache = tiny
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all" * 10)
    code, out, err = run(["transcribe", str(run_dir), str(bad)])
    assert code == 2 and err.startswith("qkv: error:") and "bad.wav" in err and len(err.splitlines()) == 1
    code, _, err = run(["transcribe", str(run_dir), "--evaluate", "nonsense"])
    assert code == 2 and "no such manifest or folder" in err
    good = sorted((cache / "wav").glob("*.wav"))[0]
    manifest = tmp_path / "m.tsv"
    manifest.write_text(f"path\tsentence\n{good}\tone two\n{bad}\tthree\nmissing.wav\tfour\n")
    code, _, err = run(["transcribe", str(run_dir), "--evaluate", str(manifest), "--max-len", "12"])
    assert code == 2 and "m.tsv:4" in err and "no such audio file" in err
    code, out, err = run(["transcribe", str(run_dir), "--evaluate", str(manifest), "--on-error", "skip",
                          "--max-len", "12"])
    assert code == 0 and "1 utterances" in out and "2 skipped" in out, err  # the bad audio file and the missing one
    code, _, err = run(["train", "speech", "--data", "digits", "--model", "ctc", "--score", "content"])
    assert code == 2 and "score" in err


def test_speech_alignment_picture(tmp_path, gen):
    from qkv.apps.speech.pictures import speech_alignment

    feats = torch.randn(120, 20, generator=gen)
    attn = torch.softmax(torch.randn(4, 30, generator=gen), -1)
    ctc = torch.log_softmax(torch.randn(30, 6, generator=gen) * 3, -1)
    path = speech_alignment(feats, list("one"), attn, ctc=ctc, vocab=["<pad>", "<s>", "</s>", "o", "n", "e"],
                            title="one", path=tmp_path / "a.png")
    assert path.stat().st_size > 5000
    assert speech_alignment(feats, [], None, ctc=ctc, path=tmp_path / "ctc.png").is_file()  # CTC alone
    with pytest.raises(ValueError, match="attention must be"):
        speech_alignment(feats, list("on"), attn)
    with pytest.raises(ValueError, match="nothing to draw"):
        speech_alignment(feats, list("one"))
    with pytest.raises(ValueError, match="ctc must be"):
        speech_alignment(feats, list("one"), attn, ctc=ctc, vocab=["a"])


def test_options_refuse_what_does_not_apply():
    from qkv.apps.speech import SpeechOptions

    with pytest.raises(ValueError, match="location-aware score only"):
        SpeechOptions(score="content", filters=4)
    with pytest.raises(ValueError, match="needs num_layers >= 3"):
        SpeechOptions(listener="pyramid", num_layers=2)
    with pytest.raises(ValueError, match="odd"):
        SpeechOptions(kernel_size=30)
    assert SpeechOptions(data="sentences").n_train == 8000 and SpeechOptions(data="clips.tsv").n_train is None
    from qkv.apps.speech.task import decoding_options

    with pytest.raises(ValueError, match="window does not apply to ctc_weight"):
        SpeechOptions(ctc_weight=0.3, window=(4, 16))
    with pytest.raises(ValueError, match="two frame counts"):
        SpeechOptions(ctc_weight=0, window=(4,))
    # the window is the default of the location-aware LAS without a CTC head only; another is given explicitly
    assert SpeechOptions().ctc_weight == 0.3 and decoding_options(SpeechOptions())["window"] == ()
    assert decoding_options(SpeechOptions(ctc_weight=0))["window"] == (8, 32)
    assert SpeechOptions(model="transformer").ctc_weight == 0 and SpeechOptions(model="ctc").ctc_weight is None
    assert (SpeechOptions().warp, SpeechOptions(model="ctc").warp, SpeechOptions(warp=0).warp) == (0.1, 0.0, 0.0)
    # decoding: beam 16 and a length penalty of 1 unless given (the settings, the Python methods and the run's options)
    import inspect

    from qkv.apps.speech import Transcriber
    from qkv.apps.speech.options import SpeechSettings

    assert SpeechSettings().beam == 16 and SpeechOptions().length_penalty == 1.0
    for method in (Transcriber.predict, Transcriber.evaluate, Transcriber.transcribe):
        assert inspect.signature(method).parameters["beam"].default == 16, method.__name__
    assert decoding_options(SpeechOptions(score="content"))["window"] == ()
    assert decoding_options(SpeechOptions(ctc_weight=0.3), window=(2, 4))["window"] == (2, 4)


@pytest.mark.parametrize("model", ["las", "transformer"])
def test_the_loss_reports_the_alignment_and_guides_it_only_early(model):
    from qkv.apps.speech import SpeechOptions, SpeechTask
    from qkv.apps.speech.task import model_spec

    kw = dict(data="words.tsv", model=model, n_mels=8, dropout=0.0, guided_until=1)
    kw.update(hidden_dim=8, num_layers=1, decoder_dim=16, attn_dim=8, embed_dim=8) if model == "las" else \
        kw.update(dim=16, num_heads=2, ffn_dim=32, num_layers=1, num_decoder_layers=1)
    g = torch.Generator().manual_seed(0)
    examples = [(torch.randn(n, 8, generator=g), [5, 6, 7][: n // 20]) for n in (40, 60)]
    losses = {}
    for guided in (0.0, 1.0):
        task = SpeechTask(SpeechOptions(**kw, guided=guided))
        torch.manual_seed(0)
        spec = model_spec(task.options, **task.sizes())
        net = create(spec["name"], **spec["config"])
        loss, count, stats = task.loss(net, task.collate(examples))
        assert 0 < float(stats["attn_focus"]) <= float(count) and abs(float(stats["attn_progress"])) <= float(count)
        losses[guided] = float(loss.detach())
        assert ("guided" in stats) == bool(guided)
        later, _, stats = task.loss(net, task.collate(examples))  # batch 2: past --guided-until 1
        assert "guided" not in stats
    assert losses[1.0] > losses[0.0]
