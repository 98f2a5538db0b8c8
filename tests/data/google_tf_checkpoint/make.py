"""Writes this folder's fixture: a tiny BERT pre-training checkpoint saved by TensorFlow itself, as
google-research/bert's run_pretraining.py leaves one, and transformers' own conversion of it.

Not run by the tests (they read what it wrote). To remake the fixture, in a virtual environment of
its own with TensorFlow and transformers 4 (transformers 5 no longer has `load_tf_weights_in_bert`)
and torch importable:

    pip install tensorflow-cpu==2.21.0 "transformers>=4.40,<5" torch
    python tests/data/google_tf_checkpoint/make.py

uncased_L-2_H-16_A-2/   bert_model.ckpt.index, bert_model.ckpt.data-00000-of-00001 (tf.compat.v1 Saver,
                        the format of Google's releases), bert_config.json, vocab.txt; the weights,
                        Adam's two slots per weight (adam_m, adam_v) and global_step, as Google's
                        optimizer names them
transformers4/          transformers 4's load_tf_weights_in_bert into BertForPreTraining, saved with
                        save_pretrained (config.json, model.safetensors)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE / "uncased_L-2_H-16_A-2"
CONFIG = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
          "hidden_size": 16, "initializer_range": 0.02, "intermediate_size": 24,
          "max_position_embeddings": 32, "num_attention_heads": 2, "num_hidden_layers": 2,
          "type_vocab_size": 2, "vocab_size": 40}
VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat", "on",
         "mat", "rug", "and", "is", "was", "it", "he", "she", "ran", "to", "of", "in", "big", "small", "red",
         "blue", ".", ",", "!", "?", "##s", "##ed", "##ing", "##ly", "##er", "play", "house", "tree"]


def google_names(cfg: dict) -> dict[str, tuple[int, ...]]:
    """google-research/bert's modeling.py variable names and shapes (kernels are [in, out])."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    names = {"bert/embeddings/word_embeddings": (v, h),
             "bert/embeddings/token_type_embeddings": (cfg["type_vocab_size"], h),
             "bert/embeddings/position_embeddings": (cfg["max_position_embeddings"], h),
             "bert/embeddings/LayerNorm/gamma": (h,), "bert/embeddings/LayerNorm/beta": (h,)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}/"
        for q in ("query", "key", "value"):
            names[p + f"attention/self/{q}/kernel"] = (h, h)
            names[p + f"attention/self/{q}/bias"] = (h,)
        names.update({p + "attention/output/dense/kernel": (h, h), p + "attention/output/dense/bias": (h,),
                      p + "attention/output/LayerNorm/gamma": (h,), p + "attention/output/LayerNorm/beta": (h,),
                      p + "intermediate/dense/kernel": (h, i), p + "intermediate/dense/bias": (i,),
                      p + "output/dense/kernel": (i, h), p + "output/dense/bias": (h,),
                      p + "output/LayerNorm/gamma": (h,), p + "output/LayerNorm/beta": (h,)})
    names.update({"bert/pooler/dense/kernel": (h, h), "bert/pooler/dense/bias": (h,),
                  "cls/predictions/transform/dense/kernel": (h, h), "cls/predictions/transform/dense/bias": (h,),
                  "cls/predictions/transform/LayerNorm/gamma": (h,), "cls/predictions/transform/LayerNorm/beta": (h,),
                  "cls/predictions/output_bias": (v,),
                  "cls/seq_relationship/output_weights": (2, h), "cls/seq_relationship/output_bias": (2,)})
    return names


def write_tf_checkpoint() -> None:
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    rng = np.random.default_rng(36)
    shutil.rmtree(SRC, ignore_errors=True)
    SRC.mkdir(parents=True)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        for name, shape in google_names(CONFIG).items():
            value = rng.normal(0, 0.5, shape).astype(np.float32)
            if name.endswith("gamma"):
                value += 1.0
            tf.compat.v1.get_variable(name, initializer=value)
            for slot in ("adam_m", "adam_v"):          # AdamWeightDecayOptimizer's slots
                tf.compat.v1.get_variable(f"{name}/{slot}", initializer=np.full(shape, 0.25, np.float32),
                                          trainable=False)
        tf.compat.v1.train.get_or_create_global_step()
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver().save(sess, str(SRC / "bert_model.ckpt"), write_meta_graph=False)
    (SRC / "checkpoint").unlink(missing_ok=True)       # the Saver's bookkeeping file; releases omit it
    (SRC / "bert_config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    (SRC / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))


def write_transformers_conversion() -> None:
    from transformers import BertConfig, BertForPreTraining, load_tf_weights_in_bert

    config = BertConfig.from_json_file(str(SRC / "bert_config.json"))
    model = BertForPreTraining(config)
    load_tf_weights_in_bert(model, config, str(SRC / "bert_model.ckpt"))
    out = HERE / "transformers4"
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(str(out), safe_serialization=True)


if __name__ == "__main__":
    write_tf_checkpoint()
    write_transformers_conversion()
    for f in sorted(HERE.rglob("*")):
        if f.is_file():
            print(f"{f.stat().st_size:8d}  {f.relative_to(HERE)}")
