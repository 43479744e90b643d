"""A language model fused into the beams of translation and summarisation: greedy fused decoding against the
step-by-step sum of the two models' log-probabilities, a zero weight against no model, extended vocabularies,
and refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from qkv.models.lm import CausalLM, LMConfig

pytestmark = pytest.mark.slow


def _random_lm(tokenizer, seed: int):
    """A language model with random weights over ``tokenizer``'s vocabulary (the tokens are the decoder's own)."""
    torch.manual_seed(seed)
    model = CausalLM(LMConfig(vocab_size=tokenizer.vocab_size, dim=16, num_heads=2, num_layers=1, max_len=256,
                              dropout=0.0)).eval()
    with torch.no_grad():  # sharper than the init's near-uniform distribution, so that it can steer a beam
        model.out.weight.mul_(40)
    return SimpleNamespace(model=model, tokenizer=tokenizer)


def _greedy_by_hand(translator, text: str, lm, weight: float, max_len: int) -> list[int]:
    """Greedy decoding where each step takes argmax of log p_decoder + weight * log p_lm, both models run on the
    whole prefix afresh (no caches, no search)."""
    from qkv.apps.translate.decode import source_ids
    from qkv.data import BOS_ID, EOS_ID, pad_sequences

    model = translator.model
    ids, _ = source_ids(translator.src_tokenizer, text)
    src, _, mask = pad_sequences([ids])
    out: list[int] = []
    with torch.no_grad():
        state = model.encode(src, mask)
        y = torch.tensor([BOS_ID])
        for _ in range(max_len):
            logits, _, state = model.decode_step(y, state)
            dec = torch.log_softmax(logits.float(), -1)[0]
            lm_in = torch.tensor([[lm.tokenizer.eos_id, *out]])
            fused = dec + weight * torch.log_softmax(lm.model(lm_in)[0, -1].float(), -1)
            token = int(fused.argmax())
            if token == EOS_ID:
                break
            out.append(token)
            y = torch.tensor([token])
    return out


def test_fused_greedy_translation_is_the_sum_of_both_models_log_probabilities(tiny_run, one_thread):
    from qkv.apps import load_predictor

    translator = load_predictor(tiny_run("translate"), "cpu")
    texts = ["7 mars 2019", "le 12 janvier 1999"]
    plain = [r.tokens for r in translator.predict(texts, beam=1, max_len=12)]
    changed = 0
    for seed in (0, 1):
        lm = _random_lm(translator.tgt_tokenizer, seed)
        for weight in (0.5, 2.0):
            fused = translator.predict(texts, beam=1, max_len=12, lm=lm, lm_weight=weight)
            for text, result in zip(texts, fused, strict=True):
                expected = _greedy_by_hand(translator, text, lm, weight, 12)
                assert translator.tgt_tokenizer.tokens_of_ids(expected) == result.tokens
            changed += [r.tokens for r in fused] != plain
    assert changed  # the language model steered some of the decodings


def test_a_zero_weight_translates_as_without_a_language_model_and_a_strong_one_changes_the_output(tiny_run,
                                                                                                 one_thread):
    from qkv.apps import load_predictor

    translator = load_predictor(tiny_run("translate"), "cpu")
    texts = ["7 mars 2019", "le 12 janvier 1999", "3 avril 2001"]
    lm = _random_lm(translator.tgt_tokenizer, 3)
    plain = translator.predict(texts, beam=3, max_len=12)
    zero = translator.predict(texts, beam=3, max_len=12, lm=lm, lm_weight=0.0)
    assert [r.tokens for r in zero] == [r.tokens for r in plain]
    assert [r.score for r in zero] == pytest.approx([r.score for r in plain], abs=1e-5)
    steered = translator.predict(texts, beam=3, max_len=12, lm=lm, lm_weight=20.0)
    assert [r.tokens for r in steered] != [r.tokens for r in plain]


def test_translation_fusion_refuses_other_tokens_other_runs_and_a_weight_without_a_model(tiny_run, one_thread):
    from qkv.apps import load_predictor
    from qkv.data.tokenize import train_tokenizer

    translator = load_predictor(tiny_run("translate"), "cpu")
    kind = translator.tgt_tokenizer.kind
    other_kind = "word" if kind != "word" else "char"
    other = _random_lm(train_tokenizer(other_kind, ["un deux trois"]), 0)
    with pytest.raises(ValueError, match=f"not the decoder's \\({kind}\\)"):
        translator.predict(["7 mars 2019"], lm=other)
    with pytest.raises(ValueError, match="not a language model"):
        translator.predict(["7 mars 2019"], lm=str(tiny_run("translate")))
    with pytest.raises(ValueError, match="need a language model|lm_weight goes with lm"):
        translator.predict(["7 mars 2019"], lm_weight=0.3)


def test_summaries_fuse_a_language_model_and_score_copied_words_as_its_unknown(tiny_run, one_thread):
    from qkv.apps import load_predictor

    summarizer = load_predictor(tiny_run("summarize"), "cpu")
    texts = ["zorblax is a quick brown fox that jumps over the lazy dog", "the lazy dog sleeps all day long"]
    lm = _random_lm(summarizer.tokenizer, 0)
    plain = summarizer.predict(texts, beam=3, max_len=8)
    zero = summarizer.predict(texts, beam=3, max_len=8, lm=lm, lm_weight=0.0)
    assert [s.text for s in zero] == [s.text for s in plain]
    steered = summarizer.predict(texts, beam=3, max_len=8, lm=lm, lm_weight=20.0)
    assert [s.text for s in steered] != [s.text for s in plain]
    figures = summarizer.evaluate(limit=3, beam=2, lm=lm, lm_weight=0.5, baselines=False)
    assert 0 <= figures["rouge1"] <= 100


def test_qkv_translate_and_summarize_take_a_language_model(tiny_run, one_thread, tmp_path, capsys):
    from qkv.cli import main

    dates = tmp_path / "dates.txt"  # a character model of the translator's output: ISO dates
    dates.write_text("\n".join(f"20{y:02d}-{m:02d}-{d:02d}" for y in range(10) for m in range(1, 13)
                               for d in (1, 9, 17, 28)) + "\n")
    lm = str(tmp_path / "lm")
    assert main(["train", "lm", "--data", str(dates), "--context", "16", "--dim", "16", "--num-heads", "2",
                 "--num-layers", "1", "--max-steps", "2", "--batch-size", "8", "--eval-tokens", "100", "--no-progress",
                 "--out", lm]) == 0
    capsys.readouterr()
    translator = str(tiny_run("translate"))
    assert main(["translate", translator, "7 mars 2019", "--beam", "2", "--max-len", "8"]) == 0
    plain = capsys.readouterr().out
    assert main(["translate", translator, "7 mars 2019", "--beam", "2", "--max-len", "8", "--lm", lm,
                 "--lm-weight", "0"]) == 0
    assert capsys.readouterr().out == plain
    assert main(["translate", translator, "7 mars 2019", "--max-len", "8", "--lm", lm, "--length-reward",
                 "0.5"]) == 0
    assert capsys.readouterr().out.startswith("7 mars 2019\t")
    assert main(["translate", translator, "7 mars 2019", "--lm", str(tiny_run("lm"))]) == 2  # letters, no digits
    assert "knows none of the decoder's tokens" in capsys.readouterr().err
    summarizer = str(tiny_run("summarize"))  # words: a character model is refused, in one line
    assert main(["summarize", summarizer, "the lazy dog sleeps all day", "--lm", lm]) == 2
    err = capsys.readouterr().err
    assert "not the decoder's (word)" in err and len(err.strip().splitlines()) == 1
    assert main(["summarize", summarizer, "the lazy dog", "--length-reward", "1"]) == 2
    assert capsys.readouterr().err.startswith("qkv: error: --length-reward")
    for bad in (str(tiny_run("translate")), "/no/such/run"):  # not a language model; no run at all
        assert main(["translate", translator, "7 mars 2019", "--lm", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"qkv: error: --lm {bad}: ") and len(err.strip().splitlines()) == 1


def test_a_language_model_that_knows_none_of_the_decoders_tokens_is_refused():
    from qkv.data import EOS_ID
    from qkv.data.tokenize import train_tokenizer
    from qkv.models.fusion import fusion_scorer

    letters = _random_lm(train_tokenizer("char", ["abcdef"]), 0)
    with pytest.raises(ValueError, match="knows none of the decoder's tokens"):
        fusion_scorer(letters, train_tokenizer("char", ["1234"]), eos_id=EOS_ID)
    partly = fusion_scorer(letters, train_tokenizer("char", ["ab12"]), eos_id=EOS_ID)
    assert partly is not None and partly.weight == pytest.approx(0.3)
