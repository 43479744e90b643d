// qkv attention page, the parts above the one-module view: a generation's steps, and every head at a glance.
// Called by page.js with what it decoded (window.QKV_PARTS); draws into HTML elements only, all text through
// textContent.
window.QKV_PARTS = function (ctx) {
  "use strict";
  const DATA = ctx.DATA, recs = ctx.recs, html = ctx.html, anchor = ctx.anchor;
  const before = (e) => { anchor.parentNode.insertBefore(e, anchor); return e; };
  const fmt = (v, d) => v === null || v === undefined ? "\u2013" : (+v).toFixed(d === undefined ? 3 : d);
  const visible = (s) => s.trim() === "" ? s.replace(/ /g, "\u2423").replace(/\s/g, "\u21b5") || "\u2205" : s;

  // ------------------------------------------------------------------ generation: one step at a time
  const G = DATA.generation;
  if (G && G.steps && G.steps.length) {
    const box = before(html("section", { id: "generation", class: "part" }));
    html("h2", {}, box).textContent = "Generation, step by step";
    const dec = recs.filter((r) => r.kind === "self" && (r.causal || /decoder/.test(r.name)) && r.qtok);
    const cross = recs.filter((r) => r.kind === "cross");
    const choices = dec.map((r) => ({ r: r, label: "self-attention, layer " + r.layer }))
      .concat(cross.map((r) => ({ r: r, label: "cross-attention, layer " + r.layer })));
    const line = html("div", { class: "controls" }, box);
    const lab = (t) => { const l = html("label", {}, line); l.appendChild(document.createTextNode(t)); return l; };
    const slider = html("input", { id: "step", type: "range", min: 0, max: G.steps.length - 1, value: 0 },
                        lab("step"));
    const selA = html("select", { id: "gen-attention" }, lab("attention"));
    choices.forEach((c, i) => { html("option", { value: i }, selA).textContent = c.label; });
    const selH = html("select", { id: "gen-head" }, lab("head"));
    const produced = html("p", { id: "produced", class: "produced" }, box);
    G.steps.forEach((s, i) => {
      const t = html("span", { class: "gtok", "data-step": i, title: "step " + i + ": p = " + fmt(s.p) }, produced);
      t.textContent = visible(s.token);
      t.addEventListener("click", () => { slider.value = i; update(); });
    });
    const info = html("div", { id: "step-info" }, box);
    const ctxBox = html("p", { id: "context", class: "context" }, box);
    const align = G.encoder_decoder && cross.length ? html("div", { id: "alignment" }, box) : null;
    function heads() {
      const c = choices[+selA.value];
      const before = selH.value;
      while (selH.firstChild) selH.removeChild(selH.firstChild);
      html("option", { value: "mean" }, selH).textContent = c ? "mean of " + c.r.heads + " heads" : "mean";
      for (let k = 0; c && k < c.r.heads; k++) html("option", { value: String(k) }, selH).textContent = "head " + k;
      if ([...selH.options].some((o) => o.value === before)) selH.value = before;
    }
    function update() {
      const s = +slider.value, step = G.steps[s], c = choices[+selA.value];
      for (const t of produced.childNodes) t.classList.toggle("on", +t.getAttribute("data-step") === s);
      while (info.firstChild) info.removeChild(info.firstChild);
      html("b", {}, info).textContent = "step " + s + ": ";
      info.appendChild(document.createTextNode("chose "));
      html("code", { class: "chosen" }, info).textContent = visible(step.token);
      info.appendChild(document.createTextNode(" (p = " + fmt(step.p) + "); top alternatives: "));
      step.top.forEach((a) => {
        const e = html("code", { class: a[0] === step.token ? "alt chosen" : "alt" }, info);
        e.textContent = visible(a[0]) + " " + fmt(a[1]);
      });
      while (ctxBox.firstChild) ctxBox.removeChild(ctxBox.firstChild);
      if (!c) return;
      const r = c.r, i = r.kind === "cross" ? s : G.first_row + s;
      if (i >= r.tq) return;
      const row = ctx.rowOf(r, i, selH.value), keys = ctx.labels(r.ktok, r.tk);
      const n = r.kind === "cross" ? r.tk : Math.min(r.tk, i + 1);
      let top = 0;
      for (let j = 0; j < n; j++) top = Math.max(top, row[j]);
      html("span", { class: "what" }, ctxBox).textContent = (r.kind === "cross" ? "the source" : "the context") +
        " as " + visible(step.token) + " was chosen (" + c.label + "; shade: share of attention, scaled to the " +
        "largest):";
      for (let j = 0; j < n; j++) {
        const e = html("span", { class: "ctok", title: keys[j] + ": " + fmt(row[j]),
                                 style: "background: rgba(255,140,0," + (row[j] / (top || 1)).toFixed(3) + ")" },
                       ctxBox);
        e.textContent = keys[j];
      }
      if (align) alignment(s);
    }
    function alignment(s) {  // the encoder-decoder alignment: generated tokens x source tokens, this step marked
      const r = cross.find((x) => x === choices[+selA.value].r) || cross[cross.length - 1];
      while (align.firstChild) align.removeChild(align.firstChild);
      html("h3", {}, align).textContent = "alignment (cross-attention, layer " + r.layer + "; rows: generated " +
        "tokens, columns: source tokens)";
      const rows = Math.min(r.tq, G.steps.length), cell = Math.max(3, Math.min(18, Math.floor(560 / r.tk)));
      const c = html("canvas", { id: "alignment-matrix", width: r.tk * cell, height: rows * cell }, align);
      const g = c.getContext("2d");
      for (let a = 0; a < rows; a++) {
        const row = ctx.rowOf(r, a, selH.value);
        let top = 0;
        for (let b = 0; b < r.tk; b++) top = Math.max(top, row[b]);
        for (let b = 0; b < r.tk; b++) {
          g.fillStyle = "rgba(31,95,191," + (row[b] / (top || 1)).toFixed(3) + ")";
          g.fillRect(b * cell, a * cell, cell, cell);
        }
      }
      g.strokeStyle = "#d33"; g.lineWidth = 2; g.strokeRect(1, s * cell + 1, r.tk * cell - 2, cell - 2);
      c.addEventListener("click", (ev) => {
        const b = c.getBoundingClientRect();
        slider.value = Math.min(rows - 1, Math.floor((ev.clientY - b.top) / b.height * rows)); update();
      });
    }
    slider.addEventListener("input", update);
    selA.addEventListener("change", () => { heads(); update(); });
    selH.addEventListener("change", update);
    heads();
    update();
  }

  // ------------------------------------------------------------------ every head at a glance
  const withHeads = recs.filter((r) => (r.kind === "self" || r.kind === "cross") && r.layer !== null &&
                                       r.layer !== undefined);
  if (!withHeads.length) return;
  const box = before(html("section", { id: "heads", class: "part" }));
  html("h2", {}, box).textContent = "Every head at a glance";
  const groups = new Map();  // a stack: the same name but for the layer number, and the same kind
  for (const r of withHeads) {
    const key = r.name.replace(/(^|\.)(\d+)(?=\.|$)/g, "$1*") + " (" + r.kind + ")";
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(r);
  }
  const imp = withHeads.filter((r) => r.importance);
  const top = Math.max(1e-12, ...imp.map((r) => Math.max(...r.importance.map(Math.abs))));
  function heat(v) {  // red: the loss rises without the head; blue: it falls
    const t = Math.min(1, Math.abs(v) / top), c = Math.round(255 * (1 - t));
    return v >= 0 ? "rgb(255," + c + "," + c + ")" : "rgb(" + c + "," + c + ",255)";
  }
  for (const [key, list] of groups) {
    list.sort((a, b) => a.layer - b.layer);
    html("h3", {}, box).textContent = key + ": layers \u00d7 heads (click one to look at it below)";
    const pair = html("div", { class: "grid-pair" }, box);
    const grid = html("div", { class: "head-grid" }, pair);
    const most = Math.max(...list.map((r) => r.heads));
    grid.style.gridTemplateColumns = "max-content repeat(" + most + ", 52px)";
    html("span", {}, grid);
    for (let k = 0; k < most; k++) html("span", { class: "axis" }, grid).textContent = "head " + k;
    for (const r of list) {
      html("span", { class: "axis" }, grid).textContent = "layer " + r.layer;
      for (let k = 0; k < most; k++) {
        if (k >= r.heads) { html("span", {}, grid); continue; }
        const img = html("img", { class: "thumb", width: 48, height: 48, alt: "layer " + r.layer + " head " + k,
                                  title: r.name + ", head " + k, "data-rec": r.id, "data-head": k }, grid);
        img.src = ctx.picture(ctx.overviewOf(r, String(k), 48));
        img.addEventListener("click", () => ctx.show(r.id, k));
      }
    }
    if (!list.some((r) => r.importance)) continue;
    const most2 = Math.max(...list.map((r) => r.heads));
    const igrid = html("div", { class: "head-grid importance-grid", id: "importance-grid" }, pair);
    igrid.style.gridTemplateColumns = "max-content repeat(" + most2 + ", 44px)";
    html("span", { class: "axis" }, igrid).textContent = "importance";
    for (let k = 0; k < most2; k++) html("span", { class: "axis" }, igrid).textContent = "head " + k;
    for (const r of list) {
      html("span", { class: "axis" }, igrid).textContent = "layer " + r.layer;
      for (let k = 0; k < most2; k++) {
        const v = r.importance && k < r.heads ? r.importance[k] : null;
        const cell = html("span", { class: "icell", "data-rec": r.id, "data-head": k,
                                    title: v === null ? "" : r.name + ", head " + k + ": " + v + " nats" }, igrid);
        if (v === null) continue;
        cell.style.background = heat(v);
        if (Math.abs(v) / top > 0.6) cell.style.color = "#fff";
        cell.textContent = fmt(v);
        cell.addEventListener("click", () => ctx.show(r.id, k));
      }
    }
  }
  const M = DATA.measures || {};
  const S = Object.assign({}, imp.length ? { importance: M.importance } : {}, DATA.statistics || {});
  const cols = Object.keys(S);
  const rows = [];
  for (const r of withHeads) {
    if (!r.stats) continue;
    for (let k = 0; k < r.heads; k++) {
      const v = { rec: r, name: r.name, layer: r.layer, head: k };
      for (const c of cols) v[c] = c === "importance" ? (r.importance ? r.importance[k] : null)
        : r.stats[c] ? r.stats[c][k] : null;
      rows.push(v);
    }
  }
  if (!rows.length) return;
  html("h3", {}, box).textContent = "head statistics (click a column to sort, a row to look at the head)";
  const table = html("table", { id: "head-stats" }, box);
  const head = html("tr", {}, html("thead", {}, table));
  const body = html("tbody", {}, table);
  let sortBy = null, down = true;
  const all = ["name", "layer", "head", ...cols];
  all.forEach((c) => {
    const th = html("th", { "data-col": c, title: S[c] || "" }, head);
    th.textContent = c;
    th.addEventListener("click", () => { down = sortBy === c ? !down : true; sortBy = c; fillRows(); });
  });
  function fillRows() {
    const sorted = rows.slice();
    if (sortBy) {
      sorted.sort((a, b) => {
        const x = a[sortBy], y = b[sortBy];
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        const d = typeof x === "string" ? x.localeCompare(y) : x - y;
        return down ? -d : d;
      });
    }
    while (body.firstChild) body.removeChild(body.firstChild);
    for (const v of sorted) {
      const tr = html("tr", {}, body);
      all.forEach((c) => { html("td", {}, tr).textContent = cols.includes(c) ? fmt(v[c]) : String(v[c]); });
      tr.addEventListener("click", () => ctx.show(v.rec.id, v.head));
    }
    for (const th of head.childNodes) {
      th.classList.toggle("sorted", th.getAttribute("data-col") === sortBy);
    }
  }
  fillRows();
  const what = html("ul", { class: "hint" }, box);
  for (const c of cols) html("li", {}, what).textContent = c + ": " + S[c];
  for (const c of Object.keys(M)) {  // the measures this page holds (records named after them)
    if (c !== "importance" && recs.some((r) => r.name.startsWith(c + " "))) {
      html("li", {}, what).textContent = c + ": " + M[c];
    }
  }
  html("li", {}, what).textContent = "attention rollout (in the list of attentions below): the attention of " +
    "each layer with the residual connection added (0.5 A + 0.5 I), multiplied through the layers: how much " +
    "each output position draws on each input token (Abnar & Zuidema, 2020).";
};
