"""Models built on the attention layers and vision blocks; :func:`create` builds any of them by name."""

from .captioning import (
    CAPTION_MODELS,
    CaptionOutput,
    FixedCaptioner,
    GridEncoder,
    HardCaptioner,
    SoftCaptioner,
    TransformerCaptioner,
)
from .classifiers import (
    BigramAttentionClassifier,
    ClassifierOutput,
    NBSVMLogits,
    RNNClassifier,
    TransformerClassifier,
    create_classifier,
    load_word_vectors,
)
from .decoding import Decodable, Hypothesis, PrefixScorer, beam_search, greedy_decode, search
from .reading import QA_MODELS, AttentiveReader, BiDAFReader, ReaderOutput, TransformerReader, decode_spans
from .registry import create, list_models
from .resnet import ResNet, create_resnet, resnet18, resnet34, resnet50, resnet101, sknet50
from .seq2seq import BahdanauSeq2Seq, EncoderDecoder, FixedContextSeq2Seq, LuongSeq2Seq, RNNConfig, reorder_state
from .small_cnn import SmallCNN
from .transformer import TransformerConfig, TransformerSeq2Seq

__all__ = [
    # every model by name
    "create", "list_models",
    # translation
    "EncoderDecoder", "RNNConfig", "FixedContextSeq2Seq", "BahdanauSeq2Seq", "LuongSeq2Seq", "TransformerConfig",
    "TransformerSeq2Seq", "reorder_state",
    # the one decoder (every generator)
    "Decodable", "Hypothesis", "PrefixScorer", "search", "greedy_decode", "beam_search",
    # images
    "ResNet", "create_resnet", "resnet18", "resnet34", "resnet50", "resnet101", "sknet50", "SmallCNN",
    # text classification
    "ClassifierOutput", "RNNClassifier", "TransformerClassifier", "BigramAttentionClassifier", "NBSVMLogits",
    "create_classifier", "load_word_vectors",
    # image captioning
    "CAPTION_MODELS", "CaptionOutput", "GridEncoder", "SoftCaptioner", "HardCaptioner", "FixedCaptioner",
    "TransformerCaptioner",
    # question answering
    "QA_MODELS", "AttentiveReader", "BiDAFReader", "TransformerReader", "ReaderOutput", "decode_spans",
]
