"""A self-contained HTML page to browse every attention map of one sentence pair: choose the
kind (encoder self, decoder self, encoder-decoder), the layer and the head (one, their mean, or
all), and see heatmaps or the two-column line view; hovering a token keeps only its lines.

Written by hand rather than with bertviz, the picture people know for this: bertviz needs
`transformers` and IPython, and its pages load d3, jQuery and require.js from a CDN, where this
page must open offline. The weights travel inside the page as JSON; nothing is fetched.
"""

from __future__ import annotations

import html
import json

from aiayn.viz.maps import KIND_AXES, KIND_TITLES, AttentionMaps

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; }
p.pair { margin: 2px 0; } p.note { color: #666; font-size: 12px; }
.controls { margin: 10px 0; display: flex; gap: 14px; flex-wrap: wrap; }
.controls label { font-weight: 600; }
#out { display: flex; flex-wrap: wrap; gap: 18px; }
svg text { font: 11px monospace; fill: #222; }
svg text.title { font: 600 12px system-ui, sans-serif; }
svg text.token { cursor: pointer; }
"""

_SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const TITLES = JSON.parse(document.getElementById('titles').textContent);
const PALETTE = ['#1f77b4','#ff7f0e','#2ca02c','#d62728','#9467bd','#8c564b','#e377c2',
                 '#7f7f7f','#bcbd22','#17becf'];
const $ = id => document.getElementById(id);
const NS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function colour(h) { return h < PALETTE.length ? PALETTE[h] : `hsl(${(h * 137) % 360},65%,45%)`; }
const AXES = JSON.parse(document.getElementById('axes').textContent);
function labels(kind) {
  const pieces = {encoder: [D.src_pieces, D.src_pieces], decoder: [D.dec_pieces, D.dec_pieces],
                  cross: [D.out_pieces, D.src_pieces]}[kind];
  return [...pieces, ...AXES[kind]];
}
function selected() {
  const w = D[$('kind').value][+$('layer').value], head = $('head').value;
  if (head === 'all') return w.map((m, h) => [m, h, 'head ' + (h + 1)]);
  if (head === 'mean') {
    const m = w[0].map((row, i) => row.map((_, j) => w.reduce((s, hm) => s + hm[i][j], 0) / w.length));
    return [[m, -1, 'mean of ' + w.length + ' heads']];
  }
  return [[w[+head], +head, 'head ' + (+head + 1)]];
}
function textWidth(list) { return 8 + 7 * Math.max(1, ...list.map(s => s.length)); }
function heatmap(m, name, rows, cols, rowAxis, colAxis) {
  const c = 16, left = textWidth(rows) + 6, top = textWidth(cols) + 40;
  const note = `rows: ${rowAxis}; columns: ${colAxis}`;
  const svg = el('svg', {width: Math.max(left + c * cols.length + 10, 7 * note.length + 10),
                         height: top + c * rows.length + 10});
  el('text', {x: 4, y: 14, class: 'title'}, svg, name);
  el('text', {x: 4, y: 30}, svg, note);
  const vmax = Math.max(1e-9, ...m.map(r => Math.max(...r)));
  rows.forEach((r, i) => {
    el('text', {x: left - 4, y: top + c * i + 12, 'text-anchor': 'end'}, svg, r);
    m[i].forEach((v, j) => {
      const t = v / vmax, light = Math.round(97 - 72 * t);
      const rect = el('rect', {x: left + c * j, y: top + c * i, width: c - 1, height: c - 1,
                               fill: `hsl(220,70%,${light}%)`}, svg);
      el('title', {}, rect, `${r} \u2192 ${cols[j]}: ${v.toFixed(3)}`);
    });
  });
  cols.forEach((s, j) => {
    const x = left + c * j + 11, y = top - 4;
    el('text', {x: x, y: y, transform: `rotate(-90 ${x} ${y})`}, svg, s);
  });
  return svg;
}
function lines(mats, rows, cols, rowAxis, colAxis) {
  const n = Math.max(rows.length, cols.length), step = 20, gap = 220, per = 4;
  const x0 = Math.max(textWidth(rows), 7 * rowAxis.length) + 10, x1 = x0 + gap;
  const legendTop = 44 + step * (n - 1) + 16, legendRows = Math.ceil(mats.length / per);
  const svg = el('svg', {width: Math.max(x1 + Math.max(textWidth(cols), 7 * colAxis.length) + 20, 110 * per + 20),
                         height: legendTop + 20 * legendRows + 10});
  el('text', {x: x0, y: 16, 'text-anchor': 'end', class: 'title'}, svg, rowAxis);
  el('text', {x: x1, y: 16, class: 'title'}, svg, colAxis);
  const yq = i => 40 + i * step * (n - 1) / Math.max(rows.length - 1, 1);
  const yk = j => 40 + j * step * (n - 1) / Math.max(cols.length - 1, 1);
  const drawn = [];
  // heads fan out a little, so that equal lines do not hide each other
  const fan = k => (k - (mats.length - 1) / 2) * Math.min(3, 8 / mats.length);
  mats.forEach(([m, h], k) => m.forEach((row, i) => row.forEach((v, j) => {
    if (v < 0.02) return;
    const line = el('line', {x1: x0 + 4, y1: yq(i) + fan(k), x2: x1 - 4, y2: yk(j) + fan(k),
                             stroke: colour(Math.max(h, 0)),
                             'stroke-width': 0.5 + 2.5 * v, 'stroke-opacity': v}, svg);
    drawn.push([line, i, v]);
  })));
  rows.forEach((s, i) => {
    const t = el('text', {x: x0, y: yq(i) + 4, 'text-anchor': 'end', class: 'token'}, svg, s);
    t.addEventListener('mouseenter', () => drawn.forEach(([l, q, v]) => l.setAttribute('stroke-opacity', q === i ? v : 0.03)));
    t.addEventListener('mouseleave', () => drawn.forEach(([l, q, v]) => l.setAttribute('stroke-opacity', v)));
  });
  cols.forEach((s, j) => el('text', {x: x1, y: yk(j) + 4}, svg, s));
  mats.forEach(([m, h, name], k) => {
    const x = 10 + 110 * (k % per), y = legendTop + 20 * Math.floor(k / per);
    el('rect', {x: x, y: y, width: 10, height: 10, fill: colour(Math.max(h, 0))}, svg);
    el('text', {x: x + 14, y: y + 9}, svg, name);
  });
  return svg;
}
function render() {
  const kind = $('kind').value, [rows, cols, rowAxis, colAxis] = labels(kind);
  const out = $('out');
  out.replaceChildren();
  const mats = selected();
  $('caption').textContent = `${TITLES[kind]}, layer ${+$('layer').value + 1} of ${D.layers}` +
    (kind === 'decoder' ? ' (causal: a position never sees the ones after it)' : '');
  if ($('view').value === 'lines') out.appendChild(lines(mats, rows, cols, rowAxis, colAxis));
  else mats.forEach(([m, h, name]) => out.appendChild(heatmap(m, name, rows, cols, rowAxis, colAxis)));
}
function option(select, value, text) {
  const o = document.createElement('option');
  o.value = value;
  o.textContent = text;
  select.appendChild(o);
}
for (let l = 0; l < D.layers; l++) option($('layer'), l, 'layer ' + (l + 1));
$('layer').value = D.layers - 1;
for (let h = 0; h < D.heads; h++) option($('head'), h, 'head ' + (h + 1));
// A link can choose the view: attention.html#kind=cross&layer=0&head=mean&view=lines
for (const [k, v] of new URLSearchParams(location.hash.slice(1))) if ($(k)) $(k).value = v;
const CONTROLS = ['kind', 'layer', 'head', 'view'];
CONTROLS.forEach(id => $(id).addEventListener('change', () => {
  history.replaceState(null, '', '#' + CONTROLS.map(c => c + '=' + $(c).value).join('&'));
  render();
}));
render();
"""


def attention_page(maps: AttentionMaps, title: str = "Attention") -> str:
    """The whole page as one string: open it in any browser, no network needed."""
    data = json.dumps(maps.to_dict(), separators=(",", ":")).replace("</", "<\\/")
    titles, axes = json.dumps(KIND_TITLES), json.dumps(KIND_AXES)
    origin = ("the encoder-decoder attention is the one the search used; the self-attention is "
              "from a teacher-forced pass over the output" if maps.from_search else
              "all weights from a teacher-forced pass over the given target")
    options = "".join(f'<option value="{k}">{html.escape(v)}</option>' for k, v in KIND_TITLES.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="pair"><b>source:</b> {html.escape(maps.source)}</p>
<p class="pair"><b>target:</b> {html.escape(maps.target)}</p>
<p class="note">{maps.n_layers} layers, {maps.n_heads} heads; {origin}. Rows are queries, columns
keys; each row sums to 1; a heatmap's darkest cell is its largest weight. In the line view,
hover a token on the left to see only its lines.</p>
<div class="controls">
<span><label for="kind">attention</label> <select id="kind">{options}</select></span>
<span><label for="layer">layer</label> <select id="layer"></select></span>
<span><label for="head">head</label> <select id="head"><option value="all">all heads</option>
<option value="mean">mean of heads</option></select></span>
<span><label for="view">view</label> <select id="view"><option value="heatmap">heatmaps</option>
<option value="lines">lines (the paper's appendix style)</option></select></span>
</div>
<p id="caption"></p>
<div id="out"></div>
<script type="application/json" id="data">{data}</script>
<script type="application/json" id="titles">{titles}</script>
<script type="application/json" id="axes">{axes}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
