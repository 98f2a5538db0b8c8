"""`bertkit inspect`'s report: the measurements of `inspect.inspect` as figures (one PNG each),
report.json and one self-contained report.html (the PNGs embedded), plus the text summary the
command prints. matplotlib (the `plot` extra) is imported where the figures are drawn."""
from __future__ import annotations

import base64
import datetime
import html
import json
from pathlib import Path

import numpy as np

from ..hardware import cpu_model, git_commit
from ..outdir import write_whole
from . import InspectError, tiny as _tiny

MODE_TITLES = {"bidirectional": "bidirectional mask (BERT's)", "causal": "causal mask"}


def facts() -> dict:
    """Date, commit and machine: every figure and the page carry them."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(), "cpu": cpu_model()}


def summary_lines(r: dict) -> list[str]:
    """What the command prints: the model, the check, [CLS]'s attention mass and the segment test per layer."""
    m, a, seg = r["model"], r["attention"], r["segment"]
    who = "the last token" if m["causal"] else "[CLS]"
    lines = [f"{m['name']}: {m['layers']} layers x {m['heads']} heads, hidden {m['hidden']}, "
             f"{'causal' if m['causal'] else 'bidirectional'}; {len(r['tokens'])} tokens",
             f"attention recomputed from the weights: every layer's output equals the model's own "
             f"(SDPA) {_bound(r['check']['max_diff'], 1e-5)}; rows sum to 1 {_bound(r['check']['row_error'], 1e-6)}",
             f"{who}'s attention (mean over heads): mass on [CLS] / [SEP] / words",
             *(f"  layer {i + 1:2d}  {a['mass']['[CLS]'][i]:.2f}  {a['mass']['[SEP]'][i]:.2f}  {a['mass']['words'][i]:.2f}"
               for i in range(m["layers"])),
             f"segment change: right segment replaced ({', '.join(seg['replacements'])}); relative L2 change "
             f"of the {len(seg['left_tokens'])} left tokens' states, mean per layer",
             "  layer  " + "  ".join(f"{mode:>13s}" for mode in seg["summary"]),
             *(f"  {i:5d}  " + "  ".join(f"{s['per_layer_mean'][i]:13.3f}" for s in seg["summary"].values())
               for i in range(m["layers"] + 1)),
             "  max    " + "  ".join(f"{_tiny(s['max']):>13s}" for s in seg["summary"].values()),
             *(f"[MASK] at {f['position']}: " + ", ".join(f"{c['token']} {c['prob']:.3f}" for c in f["candidates"])
               for f in r.get("fill_mask") or [])]
    if g := r.get("generate"):
        lines.append(f"generate ({g['method']}): {g['prompt']!r} -> {g['text']!r}")
    return lines


def _bound(x: float, bound: float) -> str:
    """'within 1e-05' when x is (a machine-independent line for the docs), else the number itself."""
    return f"within {bound:.0e}" if x <= bound else f"off by {x:.1e}"


# ---- figures --------------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InspectError("the report's figures need matplotlib: pip install 'bertkit[plot]'") from None
    return plt


def _heatmap(ax, values, xlabels=None, ylabels=None, vmax=None, annotate=False, cmap="viridis"):
    """values (rows, columns) as colours from 0 to vmax; tick labels where given (None: no ticks)."""
    v = np.asarray(values, dtype=float)
    im = ax.imshow(v, aspect="auto", cmap=cmap, vmin=0, vmax=vmax if vmax is not None else max(float(v.max()), 1e-12),
                   interpolation="nearest")
    ax.set_xticks(range(len(xlabels)) if xlabels else [], xlabels or [], rotation=90, fontsize=7)
    ax.set_yticks(range(len(ylabels)) if ylabels else [], ylabels or [], fontsize=7)
    if annotate and v.size <= 600:
        for (i, j), x in np.ndenumerate(v):
            r, g, b, _ = im.cmap(im.norm(x))                                   # dark cell: white text
            ax.text(j, i, f"{x:.2f}"[1:] if 0 <= x < 1 else f"{x:.1f}", ha="center", va="center", fontsize=6,
                    color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
    return im


def _margins(fig, left: float, hspace: float, wspace: float) -> None:
    """Margins in inches, 1.1 below and 0.6 above (tick labels and the footer keep their room whatever the size)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - 0.1 / w, bottom=1.1 / h, top=1 - 0.6 / h, hspace=hspace, wspace=wspace)


def _save(plt, fig, path: Path, r: dict, meta: dict) -> Path:
    fig.text(0.005, 0.005, f"bertkit inspect · {r['model']['name']} · {meta['date']} · commit {meta['commit']} · "
             f"{meta['cpu']}", fontsize=6, color="#666")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def figures(r: dict, out: Path, meta: dict) -> dict[str, Path]:
    """One PNG per figure in `out`: name -> path."""
    plt = _pyplot()
    m, a, tokens = r["model"], r["attention"], r["tokens"]
    L, H, T = m["layers"], m["heads"], len(tokens)
    layers = [f"layer {i + 1}" for i in range(L)]
    who = "last token" if m["causal"] else "[CLS]"
    paths = {}

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(max(8, 0.35 * T + 5), 0.45 * L + 2.2),
                                 gridspec_kw={"width_ratios": [max(T, 4), 6]})
    fig.colorbar(_heatmap(ax, a["mean"], tokens, layers, annotate=True), ax=ax, fraction=0.03)
    ax.set_title(f"{who}'s attention per layer (mean over {H} heads)", fontsize=9)
    bottom = np.zeros(L)
    for name, color in (("[CLS]", "#3454d1"), ("[SEP]", "#e8a33d"), ("words", "#3aa676")):
        bx.barh(range(L), a["mass"][name], left=bottom, color=color, label=name)
        bottom += np.asarray(a["mass"][name])
    bx.set_yticks(range(L), layers, fontsize=7)
    bx.invert_yaxis()
    bx.set_xlim(0, 1)
    bx.set_title(f"{who}'s attention mass", fontsize=9)
    bx.legend(fontsize=7, loc="lower right")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    paths["cls_attention"] = _save(plt, fig, out / "cls_attention.png", r, meta)

    cols = min(H, 4)
    rows = -(-H // cols)
    panel_h, width = 0.3 * L + 0.5, cols * max(3, 0.18 * T + 1)
    fig, axes = plt.subplots(rows, cols, figsize=(width, rows * (panel_h + 0.45) + 1.5), squeeze=False)
    per_head = np.asarray(a["rows"]).transpose(1, 0, 2)                         # (L, H, T) -> (H, L, T)
    _head_panels(axes, per_head, tokens, [str(i + 1) for i in range(L)])
    fig.suptitle(f"{who}'s attention per layer (rows) and head; scale 0-1", fontsize=9)
    _margins(fig, left=0.5, hspace=0.45, wspace=0.08)
    paths["cls_attention_heads"] = _save(plt, fig, out / "cls_attention_heads.png", r, meta)

    maps = np.asarray(r["layer_maps"])                                          # (H, T, T)
    side = max(3.0, 0.16 * T + 1.2)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * side + 0.8, rows * (side + 0.3) + 1.5), squeeze=False)
    labels = tokens if T <= 48 else None
    _head_panels(axes, maps, labels, labels, cmap="magma")
    fig.suptitle(f"layer {r['layer']}: attention of each query (row) to each key (column)", fontsize=9)
    _margins(fig, left=0.8, hspace=0.3, wspace=0.06)
    paths["attention_layer"] = _save(plt, fig, out / f"attention_layer{r['layer']}.png", r, meta)

    paths["segment_change"] = _segment_figure(plt, r, out, meta)
    return paths


def _head_panels(axes, panels, xlabels, ylabels, cmap: str = "viridis") -> None:
    """One panel per head (scale 0-1) on a grid of axes: x labels on each column's lowest panel, y labels
    on the first column; the axes past the last head are left blank."""
    rows, cols = axes.shape
    for h, ax in enumerate(axes.flat):
        if h >= len(panels):
            ax.axis("off")
            continue
        _heatmap(ax, panels[h], xlabels if h // cols == rows - 1 or h + cols >= len(panels) else None,
                 ylabels if h % cols == 0 else None, vmax=1.0, cmap=cmap)
        ax.set_title(f"head {h + 1}", fontsize=8)


def _segment_figure(plt, r: dict, out: Path, meta: dict) -> Path:
    seg, L = r["segment"], r["model"]["layers"]
    modes = list(seg["change"])
    left = seg["left_tokens"]
    fig, axes = plt.subplots(1, len(modes) + 1, figsize=(4.2 * (len(modes) + 1) + 0.15 * len(left), 0.4 * L + 2.6),
                             squeeze=False)
    mean = {mode: np.mean([np.asarray(v) for v in seg["change"][mode].values()], 0) for mode in modes}   # (L+1, n)
    vmax = max(float(v.max()) for v in mean.values()) or 1.0
    for ax, mode in zip(axes[0], modes):
        _heatmap(ax, mean[mode], left, [str(i) for i in range(L + 1)], vmax=vmax, annotate=True, cmap="Reds")
        ax.set_title(f"{MODE_TITLES[mode]}: max {_tiny(seg['summary'][mode]['max'])}", fontsize=9)
        ax.set_ylabel("layer (0 = embeddings)", fontsize=8)
    ax = axes[0][-1]
    for mode, style in zip(modes, ("-", "--")):
        for name, values in seg["change"][mode].items():
            ax.plot(range(L + 1), np.asarray(values).mean(1), style, marker="o", ms=3, label=f"{mode}, {name}")
    ax.set_xticks(range(L + 1))
    ax.set_xlabel("layer (0 = embeddings)", fontsize=8)
    ax.set_ylabel("mean relative L2 change of the left tokens", fontsize=8)
    ax.legend(fontsize=7)
    fig.suptitle("how far the left segment's states move when the right segment is replaced "
                 "(relative L2, mean over replacements)", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return _save(plt, fig, out / "segment_change.png", r, meta)


# ---- the page -------------------------------------------------------------------------------------
CAPTIONS = {
    "cls_attention": "Where the summary position looks, layer by layer (mean over heads), and its attention mass "
                     "on [CLS], [SEP] and the words.",
    "cls_attention_heads": "The same row per head.",
    "attention_layer": "The full attention maps of one layer, every head.",
    "segment_change": "The segment-change test: the right segment replaced, the left tokens' state change per layer.",
}


def check_out(out: str | Path) -> Path:
    """The report can be written there (a folder or nothing yet) and drawn (matplotlib installed)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InspectError(f"--out {out}: exists and is not a folder")
    _pyplot()
    return out


def write_report(r: dict, out: str | Path) -> Path:
    """report.json, the PNGs and report.html into folder `out`; returns the page's path."""
    out = check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = facts()
    paths = figures(r, out, meta)
    (out / "report.json").write_text(json.dumps({**r, "run": meta}, indent=1) + "\n", encoding="utf-8")
    write_whole(out / "report.html", page_html(r, paths, meta))
    return out / "report.html"


def page_html(r: dict, paths: dict[str, Path], meta: dict) -> str:
    e = html.escape
    m, seg = r["model"], r["segment"]
    parts = [f"<h1>bertkit inspect: {e(m['name'])}</h1>",
             f"<p class=meta>{e(meta['date'])} · commit {e(meta['commit'])} · {e(meta['cpu'])} · {e(m['path'])}</p>",
             f"<p><b>Input</b>: {' '.join(f'<code>{e(t)}</code>' for t in r['tokens'])}</p>",
             "<h2>Answers from this input</h2>",
             f"<p><b>What is [CLS] for?</b> {e(r['answers']['cls'])}</p>",
             f"<p><b>Why can BERT not generate text?</b> {e(r['answers']['generate'])}</p>",
             "<h2>Numbers</h2><pre>" + e("\n".join(summary_lines(r))) + "</pre>"]
    if seg["split"]:
        parts.append("<p>No pair was given: the segment test split the text in half "
                     f"(<code>{e(seg['text'])}</code> | <code>{e(seg['pair'])}</code>).</p>")
    parts.append("<p>Replacements of the right segment: " + "; ".join(
        f"{e(k)}: <code>{e(' '.join(v))}</code>" for k, v in seg["replacements"].items()) + "</p>")
    for name, path in paths.items():
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(f"<figure><img alt='{e(name)}' src='data:image/png;base64,{data}'><figcaption>"
                     f"{e(CAPTIONS[name])} ({e(path.name)})</figcaption></figure>")
    parts += _lm_section(r)
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>bertkit inspect: {e(m['name'])}</title>"
            f"<style>{STYLE}</style></head><body>" + "\n".join(parts) + "</body></html>\n")


def _lm_section(r: dict) -> list[str]:
    """The LM head's part of the page: the [MASK] predictions and the generation, token by token (or that
    the checkpoint has no LM head)."""
    e = html.escape
    if not r["model"]["lm_head"]:
        return [f"<p>This checkpoint has no language-model head ({e(r['model']['architecture'])}): no [MASK] "
                "predictions and no generation.</p>"]
    out = ["<h2>The language-model head</h2>"]
    if not r.get("fill_mask"):
        out.append("<p>No [MASK] in the text" + (" (a causal checkpoint predicts the next token)" if r["model"]["causal"]
                                                  else "") + ": no predictions shown.</p>")
    for f in r.get("fill_mask") or []:
        out.append(f"<p>[MASK] at position {f['position']}: " + ", ".join(
            f"<code>{e(c['token'])}</code> {c['prob']:.3f}" for c in f["candidates"]) + "</p>")
    if g := r.get("generate"):
        out.append(f"<p>Greedy generation ({e(g['method'])}): <code>{e(g['prompt'])}</code> &rarr; "
                   f"<code>{e(g['text'])}</code></p><p>" + " ".join(
                       f"<code>{e(t)}</code>&nbsp;{p:.3f}" for t, p in zip(g["tokens"], g["probs"])) + "</p>")
    return out


STYLE = ("body{font:15px/1.5 system-ui,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;color:#1d2433}"
         ".meta{color:#5f6b7a} img{max-width:100%} pre{background:#f5f7fa;padding:10px;overflow-x:auto}"
         "figcaption{color:#5f6b7a;font-size:13px}")
