"""One head logic, one inference engine: every head's `forward` is the encoder plus its own
`outputs`, a dict keyed by the head's `output_names`; the Predictor, ONNX export's graph and
fine-tuning's evaluation all run that method and read it by those names."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertkit.checkpoint import build
from bertkit.config import preset
from bertkit.finetune import evaluating
from bertkit.tasks.plumbing import evaluate, resolve_task
from bertkit.infer import Predictor
from bertkit.infer.export import Exportable
from bertkit.packing import pack
from bertkit.probe import ProbeModel
from bertkit.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["good", "bad", "the", "movie", "was", "a", "film", "plot", "and", "it", "is", "very", "paris"]
HEADS = [("pretraining", {}), ("masked_lm", {}), ("sequence_classification", {"num_labels": 3}),
         ("sequence_classification", {"num_labels": 1, "problem": "regression"}),
         ("token_classification", {"num_labels": 4}), ("question_answering", {}), ("multiple_choice", {})]


def tiny(head: str, causal: bool = False, **args):
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=40, hidden_size=32, num_heads=2, intermediate_size=64,
                 max_position_embeddings=64, causal=causal)
    return build(head, cfg, **args).eval()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])},
                     lowercase=True)


def batch(B: int = 3, T: int = 11, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 4, T - 3, 7][:B])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(5, 40, (B, T), generator=g) * mask
    ids[:, 0] = 2
    types = ((torch.arange(T)[None] >= lengths[:, None] // 2) & mask.bool()).long()
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def rows(b: dict) -> list[tuple[list[int], list[int]]]:
    return [(ids[m.bool()].tolist(), t[m.bool()].tolist())
            for ids, t, m in zip(b["input_ids"], b["token_type_ids"], b["attention_mask"])]


def close(a, b, atol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("head, args", HEADS, ids=[f"{h}{a.get('num_labels', '')}" for h, a in HEADS])
def test_forward_is_encoder_plus_outputs(head, args):
    """The head's forward returns exactly what `outputs` computes on the encoder's states."""
    model = tiny(head, **args)
    b = batch()
    with torch.no_grad():
        if head == "multiple_choice":                        # (B, K, T): K=2 choices per example
            mc = {k: torch.stack([v, v.flip(0)], 1) for k, v in b.items()}
            logits, _ = model(**mc)
            flat = {k: v.flatten(0, 1) for k, v in mc.items()}
            h = model.bert(flat["input_ids"], flat["token_type_ids"], flat["attention_mask"])
            close(logits, model.outputs(h, None, flat["attention_mask"])["logits"].view(3, 2))
            return
        out = model(**b)
        h = model.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        direct = model.outputs(h, None, b["attention_mask"])
        assert set(model.output_names) <= set(direct) and all(isinstance(v, torch.Tensor) for v in direct.values())
        if head in ("pretraining", "masked_lm"):
            assert out.keys() == direct.keys()
            for k in out:
                close(out[k], direct[k])
            labels = torch.full_like(b["input_ids"], -100)
            labels[:, 2] = b["input_ids"][:, 2]
            out = model(**b, mlm_labels=labels)
            direct = model.outputs(h, None, b["attention_mask"], mlm_labels=labels)
            close(out["mlm_logits"], direct["mlm_logits"])
            assert out["mlm_logits"].shape[0] == 3 and torch.equal(out["mlm_targets"], b["input_ids"][:, 2])
            return
        forward_outputs = lambda o: o[0] if isinstance(o[0], tuple) else (o[0],)      # forward: (logits, loss)
        assert list(direct) == list(model.output_names)
        for x, name in zip(forward_outputs(out), model.output_names):
            close(x, direct[name])
        # packed: the same method on (N, C) states
        flat, layout = pack(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        packed = model(flat["input_ids"], flat["token_type_ids"], packed=layout, position_ids=flat["position_ids"])
        hp = model.bert(flat["input_ids"], flat["token_type_ids"], None, flat["position_ids"], packed=layout)
        ref = model.outputs(hp, layout)
        for x, name in zip(forward_outputs(packed), model.output_names):
            close(x, ref[name])


@pytest.mark.parametrize("head, args", [h for h in HEADS if h[0] not in ("pretraining", "masked_lm")],
                         ids=lambda x: str(x) if isinstance(x, str) else "")
@pytest.mark.parametrize("causal", [False, True])
def test_predictor_and_export_graph_agree_with_forward(tokenizer, head, args, causal):
    """Predictor.outputs (packed) and Exportable (padded, the ONNX graph) give the forward's outputs."""
    model = tiny(head, causal=causal, **args)
    b = batch()
    p = Predictor(model, tokenizer)
    with torch.no_grad():
        if head == "multiple_choice":
            feats = [{"input_ids": [r1[0], r2[0]], "token_type_ids": [r1[1], r2[1]]}
                     for r1, r2 in zip(rows(b), rows(b)[::-1])]
            mc = {k: torch.stack([v, v.flip(0)], 1) for k, v in b.items()}
            logits, _ = model(**mc)
            got = p.outputs(feats, batch_size=1)
            np.testing.assert_allclose(np.stack(got), logits.numpy(), atol=1e-5)
            wrapped = Exportable(model).eval()(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            assert len(wrapped) == 2 and wrapped[0].shape == (3, 11, 32) and wrapped[1].shape == (3, 1)
            return
        out, _ = model(**b)
        got = p.outputs([{"input_ids": i, "token_type_ids": t} for i, t in rows(b)])
        wrapped = Exportable(model).eval()(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        close(wrapped[0], model.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"]))
        n = b["attention_mask"].sum(-1).tolist()
        if head == "sequence_classification":
            np.testing.assert_allclose(np.stack(got), out.numpy(), atol=1e-5)
            close(wrapped[1], out)
        elif head == "token_classification":
            for i, k in enumerate(n):
                np.testing.assert_allclose(got[i], out[i, :k].numpy(), atol=1e-5)
            close(wrapped[1], out)
        else:
            for i, k in enumerate(n):
                np.testing.assert_allclose(got[i][0], out[0][i, :k].numpy(), atol=1e-5)
                np.testing.assert_allclose(got[i][1], out[1][i, :k].numpy(), atol=1e-5)
            close(wrapped[1], out[0])
            close(wrapped[2], out[1])


@pytest.mark.parametrize("task_head, features, pooling", [("sequence_classification", "concat_last_2", None),
                                                          ("sequence_classification", "sum_all", "mean"),
                                                          ("token_classification", "last", None)])
def test_probe_outputs_one_method(tokenizer, task_head, features, pooling):
    probe = ProbeModel(tiny("encoder"), task_head, 3, features, pooling=pooling).eval()
    assert probe.all_layers
    b = batch()
    with torch.no_grad():
        logits, _ = probe(**b)
        states = probe.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"], all_layers=True)
        close(logits, probe.outputs(states, None, b["attention_mask"])["logits"])
        close(Exportable(probe).eval()(b["input_ids"], b["attention_mask"], b["token_type_ids"])[1], logits)
        got = Predictor(probe, tokenizer).outputs([{"input_ids": i, "token_type_ids": t} for i, t in rows(b)])
    if task_head == "sequence_classification":
        np.testing.assert_allclose(np.stack(got), logits.numpy(), atol=1e-5)
    else:
        for i, k in enumerate(b["attention_mask"].sum(-1).tolist()):
            np.testing.assert_allclose(got[i], logits[i, :k].numpy(), atol=1e-5)


def test_fill_mask_runs_the_heads_outputs(tokenizer):
    model = tiny("pretraining")
    p = Predictor(model, tokenizer)
    res = p.fill_mask(["the [MASK] was good", "a film [MASK] very [MASK]"], top_k=3)
    assert [len(r) for r in res] == [1, 2]
    ids = tokenizer(["the [MASK] was good"])["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids)["mlm_logits"][0, 2].softmax(-1)
    top = logits.topk(3)
    assert [c["id"] for c in res[0][0]] == top.indices.tolist()
    np.testing.assert_allclose([c["score"] for c in res[0][0]], top.values.numpy(), atol=1e-6)


@pytest.mark.parametrize("task_name, head, args", [("sst2", "sequence_classification", {"num_labels": 2}),
                                                  ("swag", "multiple_choice", {})])
def test_finetune_evaluation_runs_the_predictor_and_leaves_the_model_alone(tokenizer, task_name, head, args):
    """Evaluation during fine-tuning gives a direct forward's predictions, and the training model
    comes back as it was: same parameter objects, same values, same dtype, train mode."""
    task = resolve_task(task_name)
    model = tiny(head, **args).train()
    params = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
    modules = [type(m) for m in model.modules()]
    b = batch(B=4)
    if head == "multiple_choice":
        feats = [{"input_ids": [r1[0], r2[0]], "token_type_ids": [r1[1], r2[1]], "example_index": i,
                  "labels": i % 2} for i, (r1, r2) in enumerate(zip(rows(b), rows(b)[::-1]))]
        from bertkit.tasks.swag import ChoiceExample
        examples = [ChoiceExample(str(i), "c", "", ["x", "y"], i % 2) for i in range(4)]
    else:
        from bertkit.tasks.glue import TextExample
        feats = [{"input_ids": i, "token_type_ids": t, "example_index": k, "labels": k % 2}
                 for k, (i, t) in enumerate(rows(b))]
        examples = [TextExample(str(k), "x", None, str(k % 2)) for k in range(4)]
    with evaluating(model, tokenizer) as predictor:
        assert not model.training and predictor.model is model
        scores, predictions = evaluate(predictor, task, examples, feats, ["0", "1"] if head != "multiple_choice"
                                       else None, batch_size=3)
    assert model.training
    assert [type(m) for m in model.modules()] == modules
    for n, p in model.named_parameters():
        assert p is params[n][0] and torch.equal(p, params[n][1]) and p.dtype == torch.float32, n
    model.eval()
    with torch.no_grad():
        if head == "multiple_choice":
            logits, _ = model(**task.collate(feats))
        else:
            logits, _ = model(**{k: v for k, v in task.collate(feats).items() if k != "labels"})
    direct = logits.argmax(-1).tolist()
    if head == "multiple_choice":
        assert [predictions[str(i)] for i in range(4)] == direct
    else:
        assert [predictions[str(i)] for i in range(4)] == [str(d) for d in direct]
    assert set(scores) >= {task.main_metric}


def test_head_metadata_lives_on_the_head_classes():
    """Architecture name, owned weights and output names are class attributes of each head;
    checkpoint and ONNX export read them instead of keeping their own tables. HTTP routes are the
    serving code's (the model knows nothing of serving)."""
    from bertkit import checkpoint, model
    from bertkit.infer import engines, export, predictor
    from bertkit.model import HEADS, BertModel
    from bertkit.serve import api

    for name, cls in {"encoder": BertModel, **HEADS}.items():
        assert cls.head == name
        assert checkpoint.ARCHITECTURES[name] == cls.architecture
        assert checkpoint.HEAD_OF_ARCHITECTURE[cls.architecture] == name
        assert all(p.endswith(".") for p in cls.weight_prefixes)
        assert not hasattr(cls, "endpoints")
        assert bool(cls.output_names) == (name != "encoder")
    assert {h for heads in api.ENDPOINT_HEADS.values() for h in heads} <= set(HEADS)
    assert "/v1/" not in open(model.__file__).read()
    for src in (checkpoint, api, export, engines, predictor):   # no second copy of a head's name table
        text = open(src.__file__).read()
        assert '"BertForQuestionAnswering"' not in text and '"start_logits", "end_logits"' not in text
        assert "span_logits" not in text and "token_logits" not in text
