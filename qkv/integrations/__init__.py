"""qkv inside other libraries' models.

- :mod:`qkv.integrations.transformers`: an attention backend for Hugging Face ``transformers`` (the ``qkv[hf]``
  extra): ``register()``, then ``attn_implementation="qkv"``; every attention of the model then runs through
  :func:`qkv.attention`, so :func:`qkv.capture_attention` records it and ``qkv view`` shows it;
- :mod:`qkv.integrations.transformers_view`: ``is_hf_model_dir(path)`` and ``view_page_input(path, text)``, the page
  of a saved Hugging Face model directory (what ``qkv view DIR "text"`` writes);
- :mod:`qkv.integrations.hub`: ``resolve_model(NAME_OR_DIR, revision)``, a hub id as its snapshot folder in the
  Hugging Face cache (fetched when allowed: safetensors, configs and tokenizer files only);
- :mod:`qkv.integrations.importance`: which heads matter: ``head_importance(model, input_ids)`` (the loss's rise with
  each head zeroed), value-weighted maps, attention x gradient.

Submodules are imported on demand: ``import qkv`` never imports ``transformers``.
"""
