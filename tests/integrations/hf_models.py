"""Tiny random Hugging Face models made from configs, and a tokenizer from a small vocabulary, for the tests of
:mod:`qkv.integrations.transformers` (offline: nothing is downloaded)."""

from __future__ import annotations

import torch

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "big", "small", "red", "blue", "green",
         "bird", "sang", "in", "tree"]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
VOCAB = len(SPECIALS) + len(WORDS)
PAD, BOS, EOS = 0, 1, 2

#: the models of the tests: what each exercises
MODELS = {
    "bert": "encoder, padding",
    "gpt2": "decoder, causal without a mask, output_attentions by hooks",
    "llama": "grouped-query heads",
    "mistral": "sliding window (shorter than the inputs)",
    "gemma2": "soft-capping, grouped-query heads, sliding and full layers",
    "bart": "encoder-decoder: cross-attention",
}
DECODERS = ("gpt2", "llama", "mistral", "gemma2")


def config(name: str):
    """The config of a tiny ``name`` model: 2 layers (3 for Gemma 2: sliding and full), 4 heads, no dropout."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    if name == "bert":
        return tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             **common)
    if name == "gpt2":
        return tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                             attn_pdrop=0.0, **common)
    llama_like = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=64, **common)
    if name == "llama":
        return tf.LlamaConfig(**llama_like)
    if name == "mistral":
        return tf.MistralConfig(sliding_window=4, **llama_like)
    if name == "gemma2":
        return tf.Gemma2Config(**{**llama_like, "num_hidden_layers": 3}, head_dim=8, sliding_window=4,
                               attn_logit_softcapping=5.0, final_logit_softcapping=None, query_pre_attn_scalar=8)
    if name == "bart":
        return tf.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                             max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                             decoder_start_token_id=BOS, forced_eos_token_id=None, **common)
    if name == "qwen2":
        return tf.Qwen2Config(**llama_like, use_sliding_window=False)
    if name == "t5":
        return tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                           num_heads=4, dropout_rate=0.0, decoder_start_token_id=PAD, pad_token_id=PAD,
                           eos_token_id=EOS)
    if name == "marian":
        return tf.MarianConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                               decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                               activation_dropout=0.0, decoder_start_token_id=PAD, pad_token_id=PAD,
                               eos_token_id=EOS, forced_eos_token_id=None)
    if name == "vit":
        return tf.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64, num_labels=3, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, id2label={0: "circle", 1: "square", 2: "cross"},
                            label2id={"circle": 0, "square": 1, "cross": 2})
    raise KeyError(name)


#: models that generate, for the tests of recorded generation (decoder-only, grouped-query, encoder-decoder)
GENERATORS = ("gpt2", "llama", "qwen2", "t5", "marian", "bart")
SEQ2SEQ = ("bart", "t5", "marian")


def model(name: str, attn_implementation: str, seed: int = 0):
    """A tiny random ``name`` model with a head (masked LM, causal LM or seq2seq LM), in eval mode."""
    import transformers as tf

    if name == "vit":
        torch.manual_seed(seed)
        return tf.AutoModelForImageClassification.from_config(config(name), attn_implementation=attn_implementation)\
            .eval()
    auto = tf.AutoModelForMaskedLM if name == "bert" else tf.AutoModelForSeq2SeqLM if name in SEQ2SEQ \
        else tf.AutoModelForCausalLM
    torch.manual_seed(seed)
    m = auto.from_config(config(name), attn_implementation=attn_implementation)
    return m.eval()


def tokenizer():
    """A word-level tokenizer over :data:`WORDS` (``<pad>``, ``<s>``, ``</s>``, ``<unk>`` first)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([*SPECIALS, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def inputs(name: str, padded: bool, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A batch of 2 random sequences of 9 tokens, the second with 3 padding tokens (left for decoders, as when
    generating; right otherwise) when ``padded``; BART also gets 6 decoder tokens."""
    ids = torch.randint(len(SPECIALS), VOCAB, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        pad = slice(0, 3) if name in DECODERS else slice(6, 9)
        ids[1, pad], mask[1, pad] = PAD, 0
    out = {"input_ids": ids, "attention_mask": mask}
    if name == "bart":
        out["decoder_input_ids"] = torch.cat([torch.full((2, 1), BOS), ids[:, :5]], dim=1).clamp_min(len(SPECIALS))
        out["decoder_input_ids"][:, 0] = BOS
    return out


def save(name: str, directory) -> None:
    """``name``'s tiny model and the tokenizer, written with ``save_pretrained`` (safetensors) to ``directory``."""
    model(name, "eager").save_pretrained(directory)
    if name != "vit":
        tokenizer().save_pretrained(directory)
