"""Applications as plain libraries: each module has an options dataclass, ``load_data``, ``model_spec`` /
``build_model``, ``train_defaults``, the trainer's ``Task`` and a predictor with ``load(run_dir)`` / ``predict``.

The ``qkv`` command (:mod:`qkv.cli`) is a layer on top; CONTRIBUTING.md says how to add an application.
"""
