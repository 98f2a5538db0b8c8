"""The paper note's minimal implementation test: right-hand context changes a left token's state
under BERT's mask, and a causal mask changes the contract (`bertkit ablate --contract-test`)."""
from __future__ import annotations

from pathlib import Path
from ..config import preset
from ..tokenizer import Tokenizer


# ---- the paper note's minimal implementation test --------------------------------------------------
def contract_test(model: str | Path | None = None, seed: int = 0) -> dict:
    """Does right-hand context change a left token's state (it must, bidirectionally), and does a
    causal mask change the contract (left states independent of the right; same tensor shapes)?

    With `model`, its encoder and tokenizer; without, a random 2-layer encoder on random ids. The
    right-hand segment is replaced by other tokens of the same length, so every tensor keeps its shape."""
    import torch

    from ..model import BertModel, init_weights

    g = torch.Generator().manual_seed(seed)
    if model is not None:
        from ..checkpoint import load_model
        enc = load_model(model, head="encoder").eval()
        tok = Tokenizer.from_dir(model)
        e = tok.encode("the river bank was steep and muddy", "so we walked along the road to the town")
        ids, types = torch.tensor([e.input_ids]), torch.tensor([e.token_type_ids])
        special = {tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")}
    else:
        torch.manual_seed(seed)
        enc = BertModel(preset("tiny", vocab_size=1000, hidden_size=64, num_heads=2, intermediate_size=128)).eval()
        init_weights(enc, enc.config)
        ids = torch.randint(5, 1000, (1, 16), generator=g)
        types = torch.tensor([[0] * 8 + [1] * 8])
        special = set()
    right = (types[0] == 1).nonzero().flatten()
    left = (types[0] == 0).nonzero().flatten()
    other = ids.clone()
    vocab = enc.config.vocab_size
    for i in right.tolist()[:-1] if model is not None else right.tolist():   # keep the final [SEP]
        new = int(torch.randint(0, vocab, (1,), generator=g))
        while new in special or new == int(ids[0, i]):
            new = int(torch.randint(0, vocab, (1,), generator=g))
        other[0, i] = new
    causal = BertModel(enc.config.replace(causal=True), add_pooler=enc.pooler is not None).eval()
    causal.load_state_dict(enc.state_dict())
    with torch.no_grad():
        h, h2 = enc(ids, types), enc(other, types)
        c, c2 = causal(ids, types), causal(other, types)
    scale = float(h[0, left].abs().mean())
    res = {"model": str(model) if model else "random 2-layer encoder", "tokens": ids.shape[1],
           "left_tokens": len(left), "shape_bidirectional": list(h.shape), "shape_causal": list(c.shape),
           "left_change_bidirectional": float((h - h2)[0, left].abs().max()),
           "left_change_causal": float((c - c2)[0, left].abs().max()),
           "right_change_causal": float((c - c2)[0, right].abs().max()),
           "causal_vs_bidirectional_left": float((h - c)[0, left].abs().max()), "state_scale": scale}
    tol = 1e-5 * max(scale, 1.0)
    res["right_context_changes_left"] = res["left_change_bidirectional"] > 100 * tol
    res["causal_left_unchanged"] = res["left_change_causal"] <= tol
    res["causal_changes_contract"] = (res["causal_left_unchanged"] and res["shape_causal"] == res["shape_bidirectional"]
                                      and res["causal_vs_bidirectional_left"] > 100 * tol)
    res["passed"] = res["right_context_changes_left"] and res["causal_changes_contract"]
    return res
