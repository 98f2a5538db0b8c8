"""The page at `GET /` in a real headless browser (Debian's chromium): it loads with no external
asset, asks /v1/model for the head, and answers its prefilled examples with the model - the
similarity of two texts on all-MiniLM-L6-v2 (checked against the Predictor in this process),
and the fill-mask / classify / NER / QA panels on small checkpoints of those heads. Screenshots
go to tests/artifacts/serve_page_*.png. Skipped where chromium is not installed."""
from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import chromium, chromium_binary, server_thread, tiny_checkpoint  # noqa: E402

from bertkit.infer import Predictor  # noqa: E402
from bertkit.serve import ServeConfig, create_app  # noqa: E402
from bertkit.st_files import sentence_transformers_pooling  # noqa: E402

ARTIFACTS = Path(__file__).parent / "artifacts"
needs_chromium = pytest.mark.skipif(chromium_binary() is None,
                                    reason="chromium is not installed (Debian: apt-get install chromium)")


def page_source() -> str:
    from importlib import resources
    return (resources.files("bertkit") / "static" / "index.html").read_text(encoding="utf-8")


def test_page_is_self_contained_and_open_without_the_key(minilm):
    src = page_source()
    # no external asset: every src/href is a local path, no url() to another host, no imports
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", src)
    assert "@import" not in src and not re.search(r"url\(\s*['\"]?(https?:)?//", src)
    p = Predictor.from_dir(minilm, device="cpu")
    with TestClient(create_app(p, ServeConfig(max_length=p.max_length, api_key="s3cret"))) as c:
        r = c.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html") and "<script>" in r.text
        assert c.get("/v1/model").status_code == 401      # the page's requests need the key
        assert c.get("/v1/model", headers={"authorization": "Bearer s3cret"}).status_code == 200


def result_html(dom: str, name: str) -> str:
    m = re.search(rf'id="result-{name}" data-state="(\w+)">(.*?)</section>', dom, re.S)
    assert m, f"no result-{name} in the page:\n{dom[:3000]}"
    assert m.group(1) == "done", f"panel {name} state {m.group(1)}: {html.unescape(re.sub('<[^>]+>', ' ', m.group(2)))[:500]}"
    return m.group(2)


def screenshot(port: int, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    out = ARTIFACTS / f"serve_page_{name}.png"
    out.unlink(missing_ok=True)
    chromium(f"http://127.0.0.1:{port}/", f"--screenshot={out}", "--window-size=1100,900")
    assert out.is_file() and out.stat().st_size > 10_000, out
    print(f"screenshot: {out}")
    return out


@needs_chromium
@pytest.mark.slow
def test_page_similarity_on_minilm(minilm):
    p = Predictor.from_dir(minilm, device="cpu")
    pooling, normalize = sentence_transformers_pooling(minilm)
    app = create_app(p, ServeConfig(max_length=p.max_length, embed_pooling=pooling, embed_normalize=normalize,
                                    served_model_name="all-MiniLM-L6-v2"))
    with server_thread(app) as port:
        dom = chromium(f"http://127.0.0.1:{port}/", "--dump-dom")
        got = float(re.search(r'id="similarity-value">([-0-9.]+)<', result_html(dom, "similarity")).group(1))
        texts = [html.unescape(re.search(rf'id="sim-{k}"[^>]*>([^<]*)<', dom).group(1)) for k in "ab"]
        assert all(texts)
        e = p.embed(texts, pooling=pooling, normalize=True)
        assert abs(got - float(np.dot(e[0], e[1]))) < 2e-3          # the page shows 3 decimals
        assert "all-MiniLM-L6-v2" in dom and 'data-ready="1"' in dom
        screenshot(port, "minilm_similarity")


HEADS = {  # head: (build arguments, the panel the page shows first, what its result holds)
    "masked_lm": ({}, "fill-mask", r'class="filled">.*<b>[^<]+</b>'),
    "sequence_classification": ({"num_labels": 2, "names": ["negative", "positive"]}, "classify",
                                r'class="big">(negative|positive)<'),
    "token_classification": ({"num_labels": 5, "names": ["B-PER", "I-PER", "B-LOC", "I-LOC", "O"]}, "ner",
                             r'class="text">.*<mark class="t\d" data-type="(PER|LOC)">.*[1-9]\d* entit(y|ies) in 13 words'),
    "question_answering": ({}, "qa", r'id="qa-answer">[^<]+<|class="big">no answer<'),
}


@needs_chromium
@pytest.mark.slow
@pytest.mark.parametrize("head", list(HEADS))
def test_page_head_panels(head, tmp_path, small_vocab_dir, minilm):
    args, panel, expect = HEADS[head]
    names = args.pop("names", None)
    path = tiny_checkpoint(tmp_path, head, minilm, names=names, **args)
    p = Predictor.from_dir(path, device="cpu")
    if head == "token_classification":               # random weights tag all O: lean towards entities
        import torch
        with torch.no_grad():
            p.model.classifier.bias.copy_(torch.tensor([0.6, 0.3, 0.6, 0.3, 0.0]))
    with server_thread(create_app(p, ServeConfig(max_length=p.max_length))) as port:
        dom = chromium(f"http://127.0.0.1:{port}/", "--dump-dom")
        assert re.search(expect, result_html(dom, panel), re.S), result_html(dom, panel)[:2000]
        result_html(dom, "similarity")                          # every head also embeds
        screenshot(port, panel)


@needs_chromium
@pytest.mark.slow
def test_page_inspect_panel_on_minilm(minilm):
    """The Inspect panel draws /v1/inspect's numbers: [CLS]'s attention (layers x tokens), its mass, the
    left tokens' change per layer; the maxima it shows are those `bertkit inspect` computes."""
    from bertkit.inspect import inspect, load

    p = Predictor.from_dir(minilm, device="cpu")
    with server_thread(create_app(p, ServeConfig(max_length=p.max_length))) as port:
        dom = chromium(f"http://127.0.0.1:{port}/", "--dump-dom")
        got = result_html(dom, "inspect")
        texts = [html.unescape(re.search(rf'id="insp-{k}"[^>]*>([^<]*)<', dom).group(1)) for k in "ab"]
        r = inspect(load(minilm), *texts)
        for mode in ("bidirectional", "causal"):
            shown = re.search(rf'id="inspect-max-{mode}">([^<]+)<', got).group(1)
            assert abs(float(shown) - r["segment"]["summary"][mode]["max"]) <= max(0.05 * float(shown), 1e-6), (mode, shown)
        cls_table = re.search(r'id="inspect-cls">(.*?)</table>', got, re.S).group(1)
        assert cls_table.count("<td") == 6 * len(r["tokens"])
        assert "<svg" in got and "What is [CLS] for?" in got
        ARTIFACTS.mkdir(exist_ok=True)
        out = ARTIFACTS / "serve_page_inspect.png"
        out.unlink(missing_ok=True)
        chromium(f"http://127.0.0.1:{port}/", f"--screenshot={out}", "--window-size=1100,2600")
        assert out.is_file() and out.stat().st_size > 10_000
