"""Models built on the attention layers and vision blocks."""

from .resnet import ResNet, create_resnet, resnet18, resnet34, resnet50, resnet101, sknet50
from .small_cnn import SmallCNN

__all__ = ["ResNet", "create_resnet", "resnet18", "resnet34", "resnet50", "resnet101", "sknet50", "SmallCNN"]
from .classifiers import (  # noqa: E402
    ClassifierOutput,
    RNNClassifier,
    TransformerClassifier,
    create_classifier,
    load_word_vectors,
)
from .transformer import TransformerConfig, TransformerSeq2Seq  # noqa: E402, F401

__all__ += ["ClassifierOutput", "RNNClassifier", "TransformerClassifier", "create_classifier", "load_word_vectors"]
