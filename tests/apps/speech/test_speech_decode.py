"""Speech decoding that holds on long utterances: the attention window (median and frames against brute force, a
windowed step against the float64 formula on the window), the per-utterance length limit, the <eos> threshold,
training batches joined two by two, and the decoding options through the Transcriber's checks."""

import math

import pytest
import torch

from qkv.apps.speech.decode import eos_threshold_step, limited_step, transcribe_batch
from qkv.apps.speech.task import join_pairs, speech_tokenizer
from qkv.models import create
from qkv.models.decoding import search
from qkv.models.speech import attention_median, attention_window

EOS = 2


def test_median_and_window_match_brute_force(gen):
    w = torch.softmax(torch.randn(6, 17, generator=gen, dtype=torch.float64) * 3, -1)
    w[0] = 0.0
    w[0, 16] = 1.0  # all on the last frame
    w[1] = 0.0
    w[1, 0] = 1.0  # all on the first (the start of decoding)
    median = attention_median(w)
    window = attention_window(w, 3, 5)
    for row in range(6):
        total, m = 0.0, None
        for j in range(17):  # the first frame where the running sum reaches one half
            total += float(w[row, j])
            if total >= 0.5:
                m = j
                break
        assert int(median[row]) == m
        assert window[row].tolist() == [m - 3 <= j <= m + 5 for j in range(17)]
    with pytest.raises(ValueError, match="left and right >= 0"):
        attention_window(w, -1, 2)


def test_windowed_step_attends_only_inside_the_window(gen):
    model = create("speech-las", vocab_size=9, n_mels=6, hidden_dim=8, num_layers=1, listener="conv",
                   embed_dim=4, decoder_dim=12, attn_dim=6, filters=2, kernel_size=3, dropout=0.0).double().eval()
    x, lengths = torch.randn(2, 60, 6, generator=gen, dtype=torch.float64), torch.tensor([60, 44])
    state = model.encode(x, lengths)
    previous = torch.softmax(torch.randn(2, state["mask"].shape[1], generator=gen, dtype=torch.float64), -1)
    previous = previous * state["mask"]
    state["previous"] = previous / previous.sum(-1, keepdim=True)
    tokens = torch.tensor([3, 4])
    plain_logits, plain, _ = model.decode_step(tokens, state)
    logits, weights, after = model.decode_step(tokens, {**state, "window": (1, 2)})
    inside = attention_window(state["previous"], 1, 2) & state["mask"]
    assert weights[~inside].abs().max() == 0 and after["window"] == (1, 2)
    # on the window, the weights are the float64 softmax of the same scores there: the plain ones renormalised
    # (the score of a frame does not depend on the other frames)
    want = torch.where(inside, plain, torch.zeros_like(plain))
    torch.testing.assert_close(weights, want / want.sum(-1, keepdim=True))
    assert not torch.allclose(logits, plain_logits)  # the context, hence the logits, changed


def _random_step(vocab, gen):
    table = torch.randn(50, vocab, generator=gen) * 5  # peaked: a long hypothesis costs little
    table[:, EOS] = -20.0  # and ends late

    def step(tokens, state):
        return table[(tokens * 7 + state["t"]) % 50], None, {"t": state["t"] + 1}

    return step


@pytest.mark.parametrize("beam", [1, 3])
def test_limited_step_ends_each_input_at_its_limit(gen, beam):
    vocab = 6
    step = _random_step(vocab, gen)
    start = {"t": torch.zeros(3, dtype=torch.long)}
    limits = torch.tensor([2, 100, 4])  # the second is beyond the search's max_len: not limited
    free = search(step, start, 3, beam=beam, max_len=40, length_penalty=0.0, eos_id=EOS)
    got = search(limited_step(step, EOS, limits, beam), start, 3, beam=beam, max_len=40, length_penalty=0.0,
                 eos_id=EOS)
    for b in (0, 2):
        assert len(got[b].tokens) + 1 <= int(limits[b])  # <eos> counts as one of the limit's tokens
        assert len(free[b].tokens) + 1 > int(limits[b])  # the test limits something
    assert got[1].tokens == free[1].tokens and got[1].score == pytest.approx(free[1].score)


def test_eos_threshold_against_float64_probabilities(gen):
    logits = torch.randn(200, 7, generator=gen) * 2
    gamma = 0.3
    step = eos_threshold_step(lambda tokens, state: (logits, None, state), EOS, gamma)
    got, _, _ = step(torch.zeros(200, dtype=torch.long), None)
    p = torch.softmax(logits.double(), -1)
    others = p.clone()
    others[:, EOS] = 0
    allowed = p[:, EOS] >= gamma * others.max(-1).values
    assert bool((torch.isfinite(got[:, EOS]) == allowed).all()) and 0 < int(allowed.sum()) < 200
    keep = torch.arange(7) != EOS
    torch.testing.assert_close(got[:, keep], logits[:, keep])
    with pytest.raises(ValueError, match="eos_threshold"):
        eos_threshold_step(None, EOS, 0.0)


def test_max_rate_bounds_every_transcript(gen, one_thread):
    tok = speech_tokenizer()
    model = create("speech-las", vocab_size=tok.vocab_size, n_mels=8, hidden_dim=8, num_layers=1,
                   listener="conv", embed_dim=4, decoder_dim=8, attn_dim=4, dropout=0.0)
    with torch.no_grad():
        model.out.bias[EOS] = -50.0  # an untrained model that never ends
    feats = [torch.randn(n, 8, generator=gen) for n in (30, 120, 75)]
    for rate in (10.0, 25.0):
        for beam in (1, 2):
            out = transcribe_batch(model, tok, feats, beam=beam, max_rate=rate, window=(2, 6))
            for f, t in zip(feats, out, strict=True):
                assert len(t.tokens) == math.ceil(rate * f.shape[0] / 100) + 5 and t.stopped == "max_rate"
    with pytest.raises(ValueError, match="window must be two"):
        transcribe_batch(model, tok, feats, window=(3,))
    with pytest.raises(ValueError, match="max_rate"):
        transcribe_batch(model, tok, feats, max_rate=0.0)
    ctc = create("speech-ctc", vocab_size=tok.vocab_size, n_mels=8, hidden_dim=8, num_layers=1, listener="conv")
    with pytest.raises(ValueError, match="Listen, Attend and Spell"):
        transcribe_batch(ctc, tok, feats, window=(2, 6))
    greedy = transcribe_batch(ctc, tok, feats)
    wide = transcribe_batch(ctc, tok, feats, beam=4)
    assert all(w.score >= -1e9 and isinstance(w.text, str) for w in wide) and len(greedy) == len(wide) == 3


def test_joined_pairs_and_joined_training_batches(gen):
    from qkv.apps.speech import SpeechOptions, SpeechTask
    from qkv.data.speech import SpeechCorpus, Utterance

    tok = speech_tokenizer()
    space = tok.encode(" ")[0]
    examples = [(torch.randn(n, 8, generator=gen), tok.encode(w)) for n, w in
                ((5, "one"), (7, "two"), (6, "three"), (4, "four"), (3, "five"))]
    joined = join_pairs(examples, space)
    assert len(joined) == 3
    for k, (f, ids) in enumerate(joined[:2]):
        torch.testing.assert_close(f, torch.cat([examples[2 * k][0], examples[2 * k + 1][0]]))
        assert ids == examples[2 * k][1] + [space] + examples[2 * k + 1][1]
    assert joined[2][1] == examples[4][1]
    # the task joins the training batches it collates (evaluation decodes each utterance alone, never collated)
    utt = Utterance("x.wav", "one")
    corpus = SpeechCorpus({"train": [utt], "valid": [utt], "test": [Utterance("y.wav", "nine")]})
    task = SpeechTask(SpeechOptions(data="clips.tsv", concat=1.0, concat_from=2, spec_augment=False, warp=0, n_mels=8),
                      corpus)
    assert [task.collate(examples[:4])["features"].shape[0] for _ in range(2)] == [4, 4]  # not yet joined
    batch = task.collate(examples[:4])
    assert batch["features"].shape == (2, 12, 8) and batch["lengths"].tolist() == [12, 10]
    torch.testing.assert_close(batch["features"][1, :10], torch.cat([examples[2][0], examples[3][0]]))
    assert [tok.decode(r[r > 0].tolist()) for r in batch["tgt_in"][:, 1:]] == ["one two", "three four"]
    plain = SpeechTask(SpeechOptions(data="clips.tsv", spec_augment=False, n_mels=8), corpus).collate(examples[:4])
    assert plain["features"].shape[0] == 4
    warped = SpeechTask(SpeechOptions(data="clips.tsv", warp=0.2, spec_augment=False, n_mels=8), corpus)
    lengths = warped.collate(examples)["lengths"].tolist()
    assert all(round(0.8 * len(f)) <= n <= round(1.2 * len(f)) for (f, _), n in zip(examples, lengths, strict=True))
    with pytest.raises(ValueError, match="concat"):
        SpeechOptions(concat=1.5)


def test_a_language_model_fused_at_weight_zero_changes_nothing_and_bad_ones_are_refused(tiny_run, one_thread):
    import shutil

    if shutil.which("espeak-ng") is None or shutil.which("flite") is None:
        pytest.skip("espeak-ng and flite are not installed (make data)")
    from qkv.apps import load_predictor

    transcriber = load_predictor(tiny_run("speech"), "cpu")
    lm_run = tiny_run("lm")
    utterances = transcriber.utterances(split="test")[:2]
    from qkv.apps.speech.task import read_features

    feats, _, _ = read_features(utterances, transcriber.options.n_mels, "raise")
    plain = transcriber.transcribe(feats, beam=3, max_len=12)
    fused = transcriber.transcribe(feats, beam=3, max_len=12, lm=str(lm_run), lm_weight=0.0)
    assert [t.text for t in plain] == [t.text for t in fused]
    assert [t.score for t in plain] == pytest.approx([t.score for t in fused], abs=1e-5)
    steered = transcriber.transcribe(feats, beam=3, max_len=12, lm=str(lm_run), lm_weight=0.5, length_reward=0.2)
    assert len(steered) == 2 and all(isinstance(t.text, str) for t in steered)
    with pytest.raises(ValueError, match="not a language model"):
        transcriber.transcribe(feats, lm=str(tiny_run("translate")), lm_weight=0.3)
    with pytest.raises(ValueError, match="need a language model|lm_weight goes with lm"):
        transcriber.transcribe(feats, lm_weight=0.3)


def test_qkv_transcribe_fuses_a_language_model_and_refuses_its_options_without_one(tiny_run, one_thread, tmp_path,
                                                                                  capsys):
    import shutil

    if shutil.which("espeak-ng") is None or shutil.which("flite") is None:
        pytest.skip("espeak-ng and flite are not installed (make data)")
    import wave

    import numpy as np

    from qkv.cli import main

    audio = tmp_path / "a.wav"
    t = np.arange(8000) / 16000
    with wave.open(str(audio), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((0.3 * np.sin(2 * np.pi * 300 * t) * 32767).astype("<i2").tobytes())
    run, lm = str(tiny_run("speech")), str(tiny_run("lm"))
    assert main(["transcribe", run, str(audio), "--beam", "3", "--max-len", "12"]) == 0
    plain = capsys.readouterr().out
    assert main(["transcribe", run, str(audio), "--beam", "3", "--max-len", "12", "--lm", lm, "--lm-weight",
                 "0"]) == 0
    assert capsys.readouterr().out == plain
    assert main(["transcribe", run, str(audio), "--lm-weight", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: --lm-weight") and len(err.strip().splitlines()) == 1
