"""The word model that corrects transcripts and decodes in the beam: its probabilities (summing to 1 in every
context, the interpolated formula worked by hand), the correction (misheard words mended in context, split words
joined, weight 0 a no-op), the beam's scorer (its look-ahead telescoping to the sentence's probability, and summing
to 1 over the next characters), bad text files named, and the Transcriber's and ``qkv transcribe``'s ``words``
settings."""

import gzip
import math
import random
import shutil

import pytest

pytest.importorskip("rapidfuzz")

from qkv.apps.speech.words import WordModel, WordScorer  # noqa: E402

CORPUS = ["would you like to have a look", "he passed away quite suddenly", "i would like to have a cup of tea",
          "have a look at this", "he passed the test", "tom is away", "do you like tea"]


def test_probabilities_sum_to_one_in_every_context():
    rng = random.Random(0)
    words = ["a", "b", "c", "d", "e", "f", "g"]
    model = WordModel([" ".join(rng.choices(words, k=rng.randint(1, 6))) for _ in range(200)])
    unseen = model.prob("a", "b", "never-seen")
    contexts = [("<s>", "<s>"), ("a", "b"), ("g", "g"), ("zz", "a"), ("zz", "yy")]
    for u, v in contexts:
        total = sum(model.prob(u, v, w) for w in [*model.vocab, "</s>"]) + model.prob(u, v, "never-seen")
        assert total == pytest.approx(1.0, abs=1e-9), (u, v)
    assert 0 < unseen < min(model.prob("a", "b", w) for w in model.vocab)


def test_probability_matches_the_interpolated_formula_by_hand():
    model = WordModel(["a b c", "a b d", "b c"], discount=0.5, add=0.1)
    # counts: unigrams a 2, b 3, c 2, d 1, </s> 3 (N = 11, 5 kinds + 1 unseen);
    # bigram context b: b c 2, b d 1 (count 3, 2 followers); trigram context (a, b): a b c 1, a b d 1 (2, 2)
    uni = (2 + 0.1) / (11 + 0.1 * 6)
    bi = (2 - 0.5) / 3 + 0.5 * 2 / 3 * uni
    tri = (1 - 0.5) / 2 + 0.5 * 2 / 2 * bi
    assert model.prob("a", "b", "c") == pytest.approx(tri, rel=1e-12)
    assert model.prob("x", "b", "c") == pytest.approx(bi, rel=1e-12)  # a context never seen backs off whole
    assert model.prob("x", "y", "c") == pytest.approx(uni, rel=1e-12)
    with pytest.raises(ValueError, match="discount"):
        WordModel(["a"], discount=1.0)
    with pytest.raises(ValueError, match="at least one sentence"):
        WordModel(["", ""])


def test_correction_mends_misheard_words_in_context_and_joins_split_ones():
    model = WordModel(CORPUS)
    assert model.correct("would you like to have a lock") == "would you like to have a look"
    assert model.correct("he passed a way quite suddenly") == "he passed away quite suddenly"
    assert model.correct("do you lik tea") == "do you like tea"
    assert model.correct("would you like to have a lock", 0.0) == "would you like to have a lock"
    assert model.correct("") == ""
    # a word far from every known one stays as the decoder spelt it
    assert model.correct("he passed xqzvk") .split()[-1] == "xqzvk"
    with pytest.raises(ValueError, match="weight must be >= 0"):
        model.correct("a", -1.0)


def test_a_text_file_is_read_and_bad_ones_are_named(tmp_path):
    text = tmp_path / "words.txt.gz"
    with gzip.open(text, "wt", encoding="utf-8") as f:
        f.write("Would you like to have a look?\tVoulez-vous ...\n\nTom is away.\n")
    model = WordModel.from_file(text)
    assert {"would", "look", "tom", "away"} <= set(model.vocab) and "voulez-vous" not in model.vocab
    first = [model.prob("<s>", "<s>", w) for w in ("would", "tom", "look")]
    assert math.isclose(first[0], first[1]) and first[0] > 2 * first[2]  # the two sentences' first words
    with pytest.raises(ValueError, match="missing.txt: no such text file"):
        WordModel.from_file(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="empty.txt: no sentence"):
        WordModel.from_file(tmp_path / "empty.txt")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81" * 10)
    with pytest.raises(ValueError, match="binary.txt: not a readable UTF-8 text file"):
        WordModel.from_file(tmp_path / "binary.txt")


def test_transcriber_corrects_with_a_word_model_and_keeps_the_spelling(tiny_run, one_thread, tmp_path, capsys):
    if shutil.which("espeak-ng") is None or shutil.which("flite") is None:
        pytest.skip("espeak-ng and flite are not installed (make data)")
    import json

    from qkv.apps import load_predictor
    from qkv.apps.speech.task import read_features
    from qkv.cli import main

    run = tiny_run("speech")
    transcriber = load_predictor(run, "cpu")
    utterances = transcriber.utterances(split="test")[:3]
    feats, _, _ = read_features(utterances, transcriber.options.n_mels, "raise")
    plain = transcriber.transcribe(feats, beam=2, max_len=12, words="none")
    assert all(t.spelled == "" for t in plain)
    off = {"words_weight": 0, "words_fusion": 0}
    assert [t.text for t in transcriber.transcribe(feats, beam=2, max_len=12, **off)] == [t.text for t in plain]
    text = tmp_path / "words.txt"
    text.write_text("\n".join(u.text for u in transcriber.utterances(split="train")[:50]) + "\n")
    model = WordModel.from_file(text)
    corrected = transcriber.transcribe(feats, beam=2, max_len=12, words=str(text), words_weight=1.0, words_fusion=0)
    for p, c in zip(plain, corrected, strict=True):
        assert c.spelled == p.text and c.text == model.correct(p.text, 1.0)
    same = transcriber.transcribe(feats, beam=2, max_len=12, words="train", **off)
    assert [t.text for t in same] == [t.text for t in plain]
    # the training transcripts travel with the run: its word model needs no data
    kept = json.loads((transcriber.assets_dir / "transcripts.json").read_text())
    assert kept == [u.text for u in transcriber.utterances(split="train")]
    moved = load_predictor(run, "cpu")
    moved.dataset = None  # the corpus is not there
    by_run = moved.transcribe(feats, beam=2, max_len=12, words="train", words_weight=1.0, words_fusion=0)
    by_data = [WordModel(kept).correct(t.text, 1.0) for t in plain]
    assert [t.text for t in by_run] == by_data
    # by default, the word model of the text the run keeps (a digits run: its transcripts), in the beam and after
    assert not (transcriber.assets_dir / "texts.json").exists() and moved.kept_text() == kept
    default = transcriber.transcribe(feats, beam=2, max_len=12)
    fused = transcriber.transcribe(feats, beam=2, max_len=12, words=WordModel(kept), words_fusion=0.4,
                                   words_weight=0.2)
    assert [(t.text, t.spelled) for t in default] == [(t.text, t.spelled) for t in fused]
    # a heavy word model in the beam spells only its words (an untrained decoder spells nonsense)
    heavy = transcriber.transcribe(feats, beam=4, max_len=80, max_rate=1000, words=str(text), words_fusion=20.0,
                                   words_weight=0)
    ended = [t for t in heavy if t.stopped == "end"]
    assert ended and all(set(t.text.split()) <= set(model.vocab) for t in ended), [t.text for t in heavy]
    assert any(set(t.text.split()) - set(model.vocab) for t in plain)
    after_only = transcriber.transcribe(feats, beam=2, max_len=12, words_fusion=0)
    assert [t.text for t in after_only] == [WordModel(kept).correct(t.text) for t in plain]

    audio = utterances[0].audio
    assert main(["transcribe", str(run), audio, "--max-len", "12", "--words", str(text), "--json",
                 str(tmp_path / "out.json")]) == 0
    row = json.loads((tmp_path / "out.json").read_text())[0]
    assert "spelled" in row and set(row["output"].split()) <= {*model.vocab, *row["spelled"].split()}
    capsys.readouterr()
    assert main(["transcribe", str(run), audio, "--words", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err
    assert "missing.txt: no such text file" in err and len(err.strip().splitlines()) == 1
    assert main(["transcribe", str(run), audio, "--words-weight", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: --words-weight") and len(err.strip().splitlines()) == 1
    assert main(["transcribe", str(run), audio, "--words-fusion", "-0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: --words-fusion") and len(err.strip().splitlines()) == 1


TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>", *"abcdefghijklmnopqrstuvwxyz'", " "]


def _spell(text: str) -> list[int]:
    return [TOKENS.index(c) for c in text]


def _random_model(rng: random.Random) -> tuple[WordModel, list[str]]:
    words = ["".join(rng.choices("abcde", k=rng.randint(1, 4))) for _ in range(30)]
    return WordModel([" ".join(rng.choices(words, k=rng.randint(1, 6))) for _ in range(120)]), words


def test_the_beams_word_scores_telescope_to_the_sentences_probability():
    import torch

    rng = random.Random(1)
    for _ in range(5):
        model, words = _random_model(rng)
        weight = rng.uniform(0.1, 2.0)
        scorer = WordScorer(model, TOKENS, weight=weight, eos_id=2)
        # known words, unseen ones (letters no word has, a special token) and a prefix of a known word
        sentence = [rng.choice(words) for _ in range(rng.randint(1, 5))] + ["zq", "x<unk>y", rng.choice(words)[:-1]]
        rng.shuffle(sentence)
        ids = [t for w in sentence for t in [*(_spell(w) if "<" not in w else
                                               [*_spell(w[0]), 3, *_spell(w[-1])]), TOKENS.index(" ")]][:-1] + [2]
        total = sum(float(scorer(torch.tensor([ids[:t]]), None)[0][0, ids[t]]) for t in range(len(ids)))
        padded = ["<s>", "<s>", *sentence, "</s>"]
        by_hand = sum(math.log(model.prob(padded[i - 2], padded[i - 1], padded[i] if padded[i] in model.vocab
                                          or padded[i] == "</s>" else "\0unseen"))
                      for i in range(2, len(padded)))
        assert total == pytest.approx(weight * by_hand, rel=1e-5)


def test_the_look_ahead_sums_to_one_over_what_may_follow():
    import torch

    rng = random.Random(2)
    model, words = _random_model(rng)
    scorer = WordScorer(model, TOKENS, weight=1.0, eos_id=2)
    letters = [i for i, t in enumerate(TOKENS) if t not in (" ", "<eos>")]
    for _ in range(20):
        before = " ".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
        word = rng.choice(words)
        prefix = word[: rng.randint(1, len(word))]
        row = scorer(torch.tensor([_spell((before + " " if before else "") + prefix)]), None)[0][0].double()
        # inside the vocabulary: the next letter of a word, or the word ending here (closed by a space)
        inside = [i for i in letters if any(w.startswith(prefix + TOKENS[i]) for w in model.vocab)]
        total = row[inside].exp().sum() + (row[TOKENS.index(" ")].exp() if prefix in model.vocab else 0)
        assert float(total) == pytest.approx(1.0, abs=1e-5), (before, prefix)
    # at a word's start: a word, the end, or one unseen word
    row = scorer(torch.tensor([_spell(words[0] + " ")]), None)[0][0].double()
    unseen = model.prob("<s>", words[0], "\0unseen")
    inside = [i for i in letters if any(w.startswith(TOKENS[i]) for w in model.vocab)]
    assert float(row[inside].exp().sum() + row[2].exp()) == pytest.approx(1.0 - unseen, abs=1e-5)
    # leaving the vocabulary costs one unseen word, wherever it happens
    assert float(row[TOKENS.index("z")]) == pytest.approx(math.log(unseen), rel=1e-5)
    with pytest.raises(ValueError, match=">= 0"):
        WordScorer(model, TOKENS, weight=-1.0, eos_id=2)


def test_the_distribution_is_every_words_probability():
    rng = random.Random(3)
    model, _ = _random_model(rng)
    for u, v in [("<s>", "<s>"), (model.vocab[0], model.vocab[1]), ("never", "seen"), ("<s>", model.vocab[2])]:
        assert list(model.distribution(u, v)) == pytest.approx([model.prob(u, v, w) for w in model.vocab], rel=1e-12)


def test_unspoken_texts_are_the_source_less_every_split(tmp_path):
    from qkv.apps.speech.synth import _plan, sentence_texts

    source = tmp_path / "t.txt"
    source.write_text("\n".join(f"sentence number {' '.join('abcdefghij'[int(d)] for d in str(i))} here"
                                for i in range(40)) + "\n")
    plan, unspoken = _plan("sentences", 10, 3, 4, 2, str(source), 7)
    spoken = {text for _, text, *_ in plan}
    assert unspoken and not spoken & set(unspoken)
    assert set(unspoken) | {text for split, text, *_ in plan if split != "long"} == set(sentence_texts(source, seed=7))
    assert _plan("digits", 10, 3, 4, 2, None, 7)[1] == []


@pytest.mark.parametrize("texts", [["a sentence no one speaks", "another one"], []])
def test_a_run_keeps_its_transcripts_and_its_corpus_unspoken_texts(tmp_path, texts, monkeypatch):
    import json

    import numpy as np
    import soundfile

    from qkv.apps.speech import SpeechOptions, SpeechTask
    from qkv.data.speech import SpeechCorpus, Utterance

    rng = np.random.default_rng(0)
    clips = []
    for i, text in enumerate(["one two", "three", "four five six"]):
        soundfile.write(tmp_path / f"{i}.wav", 0.1 * rng.standard_normal(4000), 16000)
        clips.append(Utterance(str(tmp_path / f"{i}.wav"), text))
    corpus = SpeechCorpus({"train": clips[:2], "valid": clips[2:], "test": clips[2:]}, texts=texts)
    task = SpeechTask(SpeechOptions(data="clips.tsv", n_mels=8), corpus)
    task.setup()
    task.save_assets(tmp_path)
    assert json.loads((tmp_path / "transcripts.json").read_text()) == ["one two", "three"]
    assert (json.loads((tmp_path / "texts.json").read_text()) if texts else (tmp_path / "texts.json").exists()) == \
        (texts or False)
    # a huge text source is kept only in part (its order is already a seeded shuffle)
    monkeypatch.setattr("qkv.apps.speech.task.MAX_KEPT_TEXTS", 1)
    task = SpeechTask(SpeechOptions(data="clips.tsv", n_mels=8), corpus)
    task.setup()
    assert task.texts == (texts[:1] or None)


def test_the_scorers_caches_stay_bounded_and_change_nothing(monkeypatch):
    import torch

    rng = random.Random(4)
    model, words = _random_model(rng)
    sentences = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(30)]

    def scores(scorer):
        out = []
        for s in sentences:
            ids = [*_spell(s), 2]
            out += [float(scorer(torch.tensor([ids[:t]]), None)[0][0, ids[t]]) for t in range(len(ids))]
        return out

    roomy = scores(WordScorer(model, TOKENS, weight=0.7, eos_id=2))
    monkeypatch.setattr("qkv.apps.speech.words._CACHED_FLOATS", 64)
    tight = WordScorer(model, TOKENS, weight=0.7, eos_id=2)
    assert scores(tight) == pytest.approx(roomy, rel=1e-6)
    assert len(tight._cum) <= 16 and len(tight._scores) * len(TOKENS) <= 64 + len(TOKENS)
