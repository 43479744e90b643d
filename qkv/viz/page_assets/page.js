// qkv attention page: everything inline, nothing fetched. Data: the JSON in #qkv-data (weights: uint8, base64;
// large records: each row's top k as key indices and uint8 weights, and a downsampled overview).
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("qkv-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const el = (tag, attrs, parent) => {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  };
  const html = (tag, attrs, parent) => {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  };
  const text = (parent, x, y, s, attrs) => {
    const t = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  };
  const decode = (b64) => {
    const s = atob(b64), a = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) a[i] = s.charCodeAt(i);
    return a;
  };
  const recs = DATA.records.map((r) => {
    const o = Object.assign({}, r);
    if (r.data) o.w = decode(r.data);
    if (r.sparse) {
      const b = decode(r.sparse.idx);
      o.sp = { k: r.sparse.k, val: decode(r.sparse.val),
               idx: r.sparse.wide ? new Uint32Array(b.buffer) : new Uint16Array(b.buffer) };
    }
    if (r.overview) o.ov = Object.assign({}, r.overview, { px: decode(r.overview.data) });
    return o;
  });
  const KIND = { self: "self-attention", cross: "cross-attention", pooling: "attention pooling",
                 channel: "channel attention", spatial: "spatial attention", rollout: "attention rollout" };

  // ---- page skeleton (all text through textContent: nothing from the data is parsed as HTML)
  html("h1", {}, document.body).textContent = DATA.title;
  for (const n of DATA.notes) html("p", { class: "notes" }, document.body).textContent = n;
  const controls = html("div", { class: "controls" }, document.body);
  const control = (label, id) => {
    const l = html("label", {}, controls);
    l.appendChild(document.createTextNode(label));
    return html("select", { id: id }, l);
  };
  const selRec = control("attention", "attention");
  const selHead = control("head", "head");
  const selView = control("view", "view-kind");
  const selQuery = control("query", "query");
  const btnSvg = html("button", { id: "save-svg", type: "button" }, controls);
  btnSvg.textContent = "save SVG";
  const btnPng = html("button", { id: "save-png", type: "button" }, controls);
  btnPng.textContent = "save PNG";
  const info = html("div", { id: "info" }, document.body);
  const svg = el("svg", { id: "view", xmlns: NS, width: 600, height: 200 }, document.body);
  html("p", { class: "hint" }, document.body).textContent =
    "Hover a token to see its weights (a matrix cell shows its value). The matrix, image and text views are scaled to " +
    "their largest weight; lines show the weights as they are. Weights are rounded to 1/255.";

  recs.forEach((r, i) => {
    const o = html("option", { value: i }, selRec);
    const layer = r.layer === null || r.layer === undefined ? "" : ", layer " + r.layer;
    o.textContent = r.name + " (" + (KIND[r.kind] || r.kind) + layer + ")";
  });

  // ---- data access
  const cur = () => recs[+selRec.value];
  function matrix(r) {  // Float32Array (tq * tk) for the selected head or the mean of the heads
    const n = r.tq * r.tk, out = new Float32Array(n), h = selHead.value;
    if (h === "mean" || h === "") {
      for (let k = 0; k < r.heads; k++) for (let i = 0; i < n; i++) out[i] += r.w[k * n + i] / 255 / r.heads;
    } else {
      const k = +h;
      for (let i = 0; i < n; i++) out[i] = r.w[k * n + i] / 255;
    }
    return out;
  }
  function rowOf(r, i, h) {  // Float32Array (tk): row i of head h ("mean": of the heads), dense or sparse
    const out = new Float32Array(r.tk), heads = h === "mean" || h === "" || h === undefined ? null : [+h];
    const list = heads || Array.from({ length: r.heads }, (_, k) => k), f = 1 / 255 / list.length;
    for (const k of list) {
      if (r.sp) {
        const base = (k * r.tq + i) * r.sp.k;
        for (let j = 0; j < r.sp.k; j++) out[r.sp.idx[base + j]] += r.sp.val[base + j] * f;
      } else {
        const base = (k * r.tq + i) * r.tk;
        for (let j = 0; j < r.tk; j++) out[j] += r.w[base + j] * f;
      }
    }
    return out;
  }
  const big = (r) => r.sp || r.tq * r.tk > 40000;
  const visible = (s) => s.trim() === "" ? s.replace(/ /g, "\u2423").replace(/\s/g, "\u21b5") || "\u2205" : s;
  function labels(name, n, prefix) {
    const list = name ? DATA.tokens[name] : null;
    const out = [];
    for (let i = 0; i < n; i++) out.push(list ? visible(list[i]) : (prefix || "") + i);
    return out;
  }
  const short = (s) => s.length > 14 ? s.slice(0, 13) + "\u2026" : s;
  const qLabels = (r) => r.kind === "channel" ? (r.tq > 1 ? labels(null, r.tq, "branch ") : ["channels"])
    : r.kind === "pooling" ? labels(null, r.tq, "query ") : labels(r.qtok, r.tq);
  const kLabels = (r) => r.kind === "channel" ? labels(null, r.tk, "c") : labels(r.ktok, r.tk);
  function views(r) {
    if (r.kind === "channel") return ["bars"];
    const v = [];
    if (r.kind === "pooling") v.push("text");
    if (DATA.image && r.grid) v.push("image");
    if (big(r)) {
      v.push("overview");
      if (r.ktok) v.push("text");
      return v;
    }
    if (r.kind !== "spatial") v.push("lines");
    v.push("matrix");
    if (r.kind !== "pooling" && r.ktok) v.push("text");
    return v;
  }

  // ---- drawing
  const clear = (w, h) => {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.classList.remove("focus");
    svg.setAttribute("width", w); svg.setAttribute("height", h);
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    el("rect", { x: 0, y: 0, width: w, height: h, fill: "#fff" }, svg);
  };
  function drawLines(r, m) {
    const q = qLabels(r), k = kLabels(r), row = 18, n = Math.max(q.length, k.length);
    const w = 640, h = n * row + 30, xl = 200, xr = 440;
    clear(w, h);
    const y = (i) => 20 + i * row;
    const lines = el("g", {}, svg);
    for (let i = 0; i < r.tq; i++) for (let j = 0; j < r.tk; j++) {
      const a = m[i * r.tk + j];
      if (a < 0.004) continue;
      el("line", { x1: xl + 6, y1: y(i), x2: xr - 6, y2: y(j), "stroke-opacity": a.toFixed(3),
                   "stroke-width": 2, "data-q": i, "data-k": j }, lines);
    }
    const focus = (side, i, on) => {
      svg.classList.toggle("focus", on);
      for (const l of lines.childNodes) l.classList.toggle("hl", on && +l.getAttribute(side) === i);
    };
    const tokens = (list, x, anchor, side) => list.forEach((s, i) => {
      const t = text(svg, x, y(i), s, { "text-anchor": anchor, class: "tok", "data-side": side, "data-i": i });
      t.addEventListener("mouseenter", () => { focus(side, i, true); t.classList.add("hl"); });
      t.addEventListener("mouseleave", () => { focus(side, i, false); t.classList.remove("hl"); });
    });
    tokens(q, xl, "end", "data-q");
    tokens(k, xr, "start", "data-k");
  }
  function drawMatrix(r, m) {
    const q = qLabels(r).map(short), k = kLabels(r).map(short);
    const cell = Math.max(4, Math.min(24, Math.floor(480 / Math.max(r.tq, r.tk))));
    let top = 0;
    for (let i = 0; i < m.length; i++) top = Math.max(top, m[i]);
    const left = 130, up = 100, w = left + cell * r.tk + 20, h = up + cell * r.tq + 20;
    clear(w, h);
    const cells = [];
    for (let i = 0; i < r.tq; i++) for (let j = 0; j < r.tk; j++) {
      const a = m[i * r.tk + j];
      const c = el("rect", { x: left + j * cell, y: up + i * cell, width: cell, height: cell, class: "cell",
                             fill: "#1f5fbf", "fill-opacity": (a / (top || 1)).toFixed(3), "data-q": i, "data-k": j },
                   svg);
      el("title", {}, c).textContent = q[i] + " \u2192 " + k[j] + ": " + a.toFixed(3);
      cells.push(c);
    }
    const label = (s, x, y, attrs, side, i) => {
      const t = text(svg, x, y, s, Object.assign({ class: "tok", "data-side": side, "data-i": i }, attrs));
      t.addEventListener("mouseenter", () => {
        t.classList.add("hl");
        for (const c of cells) {
          const mine = +c.getAttribute(side) === i;
          c.classList.toggle("hl", mine); c.classList.toggle("dim", !mine);
        }
      });
      t.addEventListener("mouseleave", () => {
        t.classList.remove("hl");
        for (const c of cells) { c.classList.remove("hl"); c.classList.remove("dim"); }
      });
    };
    if (cell >= 8) {
      q.forEach((s, i) => label(s, left - 6, up + (i + 0.5) * cell, { "text-anchor": "end" }, "data-q", i));
      k.forEach((s, j) => {
        const x = left + (j + 0.5) * cell;
        label(s, x, up - 6, { transform: "rotate(-60 " + x + " " + (up - 6) + ")" }, "data-k", j);
      });
    }
  }
  function drawImage(r, m) {
    const img = DATA.image, scale = Math.max(1, Math.floor(360 / Math.max(img.h, img.w)));
    const w = img.w * scale, h = img.h * scale;
    clear(Math.max(w + 20, 640), h + 40);
    el("image", { href: img.src, x: 10, y: 10, width: w, height: h, preserveAspectRatio: "none",
                  style: "image-rendering: pixelated" }, svg);
    const i = Math.min(+selQuery.value || 0, r.tq - 1), gh = r.grid[0], gw = r.grid[1];
    m = rowOf(r, i, selHead.value);
    let top = 0;
    for (let j = 0; j < r.tk; j++) top = Math.max(top, m[j]);
    const g = el("g", {}, svg);
    for (let y = 0; y < gh; y++) for (let x = 0; x < gw; x++) {
      const a = m[y * gw + x] / (top || 1);
      el("rect", { x: 10 + x * w / gw, y: 10 + y * h / gh, width: w / gw, height: h / gh, class: "cell",
                   fill: "#ff3b00", "fill-opacity": (0.75 * a).toFixed(3), "data-k": y * gw + x }, g);
    }
    if (r.qgrid) {  // a query pixel of a non-local block: mark it
      const qy = Math.floor(i / r.qgrid[1]), qx = i % r.qgrid[1];
      el("rect", { x: 10 + qx * w / r.qgrid[1], y: 10 + qy * h / r.qgrid[0], width: w / r.qgrid[1],
                   height: h / r.qgrid[0], fill: "none", stroke: "#0c0", "stroke-width": 2 }, svg);
    }
    text(svg, 10, h + 26, "query: " + qLabels(r)[i] + " (red: share of its attention, scaled to the largest)");
  }
  function drawText(r, m) {
    const k = kLabels(r), rows = r.kind === "pooling" ? r.tq : 1, i0 = r.kind === "pooling" ? 0 : +selQuery.value;
    const w = 760, line = 26, width = (s) => 8 * s.length + 10;
    let lines = 1, x = 10;
    for (const s of k) { if (x + width(s) > w - 10) { lines++; x = 10; } x += width(s); }
    clear(w, rows * (lines * line + 30) + 10);
    for (let rr = 0; rr < rows; rr++) {
      const i = Math.min(i0 + rr, r.tq - 1), base = 10 + rr * (lines * line + 30), row = rowOf(r, i, selHead.value);
      text(svg, 10, base + 8, (r.kind === "pooling" ? "query " + i : "query: " + qLabels(r)[i]), { class: "tok" });
      let top = 0;
      for (let j = 0; j < r.tk; j++) top = Math.max(top, row[j]);
      x = 10; let y = base + 26;
      k.forEach((s, j) => {
        if (x + width(s) > w - 10) { x = 10; y += line; }
        const a = row[j] / (top || 1);
        const c = el("rect", { x: x, y: y - 10, width: width(s) - 4, height: 20, rx: 3, class: "cell",
                               fill: "#ff8c00", "fill-opacity": a.toFixed(3), "data-k": j }, svg);
        el("title", {}, c).textContent = s + ": " + row[j].toFixed(3);
        text(svg, x + 3, y, s, { class: "tok", "data-i": j });
        x += width(s);
      });
    }
  }
  function drawBars(r, m) {
    const barW = Math.max(2, Math.min(16, Math.floor(600 / r.tk))), hh = 120;
    const w = 60 + barW * r.tk + 20, h = r.tq * (hh + 30) + 10;
    clear(w, h);
    const names = qLabels(r);
    for (let i = 0; i < r.tq; i++) {
      const base = 10 + i * (hh + 30) + hh;
      text(svg, 4, base - hh - 2, names[i]);
      el("line", { x1: 50, y1: base, x2: w - 10, y2: base, stroke: "#999" }, svg);
      for (let j = 0; j < r.tk; j++) {
        const a = m[i * r.tk + j];
        const b = el("rect", { x: 55 + j * barW, y: base - a * hh, width: barW - 1, height: a * hh, class: "cell",
                               fill: "#1f5fbf", "data-k": j }, svg);
        el("title", {}, b).textContent = "channel " + j + ": " + a.toFixed(3);
      }
    }
  }
  // a downsampled picture (h x w) of a record's head or mean: stored for sparse records, computed for dense ones
  function overviewOf(r, head, side) {
    const list = head === "mean" || head === "" || head === undefined ? Array.from({ length: r.heads }, (_, k) => k)
      : [+head];
    if (r.ov) {
      const h = r.ov.h, w = r.ov.w, out = new Float32Array(h * w);
      for (const k of list) for (let i = 0; i < h * w; i++) out[i] += r.ov.px[k * h * w + i] * r.ov.max[k] / 255;
      return { h: h, w: w, px: out };
    }
    const h = Math.min(r.tq, side), w = Math.min(r.tk, side), out = new Float32Array(h * w);
    for (const k of list) for (let i = 0; i < r.tq; i++) for (let j = 0; j < r.tk; j++) {
      out[Math.floor(i * h / r.tq) * w + Math.floor(j * w / r.tk)] += r.w[(k * r.tq + i) * r.tk + j];
    }
    return { h: h, w: w, px: out };
  }
  function picture(o, size, mark) {  // a PNG data URL of an overview, scaled to its largest value
    const c = document.createElement("canvas");
    c.width = o.w; c.height = o.h;
    const ctx = c.getContext("2d"), img = ctx.createImageData(o.w, o.h);
    let top = 0;
    for (let i = 0; i < o.px.length; i++) top = Math.max(top, o.px[i]);
    for (let i = 0; i < o.px.length; i++) {
      const a = o.px[i] / (top || 1);
      img.data[4 * i] = 255 - a * 224; img.data[4 * i + 1] = 255 - a * 160; img.data[4 * i + 2] = 255 - a * 64;
      img.data[4 * i + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    if (mark !== undefined && mark !== null) { ctx.fillStyle = "rgba(220,30,30,0.6)"; ctx.fillRect(0, mark, o.w, 1); }
    return c.toDataURL("image/png");
  }
  let zoomAt = null;
  function drawOverview(r) {
    const o = overviewOf(r, selHead.value, 256), side = 512, top = 30, left = 10;
    const zoom = zoomAt && zoomAt.rec === r ? zoomAt : null, Z = 48;
    clear(side + 40 + (zoom ? 16 * 0 + 560 : 0), side + 60);
    text(svg, left, 14, "overview: " + r.tq + " \u00d7 " + r.tk + (r.tq > o.h || r.tk > o.w ?
      " in blocks of " + Math.ceil(r.tq / o.h) + " \u00d7 " + Math.ceil(r.tk / o.w) : "") +
      " (darker: more attention; click for the exact weights)");
    const im = el("image", { href: picture(o), x: left, y: top, width: side, height: side, preserveAspectRatio: "none",
                             style: "image-rendering: pixelated", id: "overview", class: "tok" }, svg);
    el("rect", { x: left, y: top, width: side, height: side, fill: "none", stroke: "#999" }, svg);
    text(svg, left, top + side + 14, "keys \u2192 (" + r.tk + ")");
    text(svg, left + side + 4, top + 8, "queries \u2193 (" + r.tq + ")");
    im.addEventListener("click", (ev) => {
      const box = im.getBoundingClientRect();
      const i = Math.floor((ev.clientY - box.top) / box.height * r.tq), j = Math.floor((ev.clientX - box.left) / box.width * r.tk);
      zoomAt = { rec: r, i: Math.max(0, Math.min(r.tq - Z, i - Z / 2)), j: Math.max(0, Math.min(r.tk - Z, j - Z / 2)) };
      draw();
    });
    if (!zoom) return;
    const q = qLabels(r), k = kLabels(r), cell = 10, x0 = side + 110, y0 = top + 60;
    text(svg, x0 - 100, top + 10, "exact weights: queries " + zoom.i + "\u2013" + (zoom.i + Z - 1) + ", keys " + zoom.j +
      "\u2013" + (zoom.j + Z - 1), { id: "zoom-title" });
    const rows = Math.min(Z, r.tq - zoom.i), cols = Math.min(Z, r.tk - zoom.j);
    const g = el("g", { id: "zoom" }, svg);
    for (let a = 0; a < rows; a++) {
      const row = rowOf(r, zoom.i + a, selHead.value);
      text(g, x0 - 4, y0 + (a + 0.5) * cell, short(q[zoom.i + a]), { "text-anchor": "end", style: "font-size: 8px" });
      for (let b = 0; b < cols; b++) {
        const v = row[zoom.j + b];
        const c = el("rect", { x: x0 + b * cell, y: y0 + a * cell, width: cell, height: cell, class: "cell",
                               fill: "#1f5fbf", "fill-opacity": Math.min(1, v * 2).toFixed(3) }, g);
        el("title", {}, c).textContent = q[zoom.i + a] + " \u2192 " + k[zoom.j + b] + ": " + v.toFixed(3);
      }
    }
    svg.setAttribute("width", x0 + cols * cell + 20); svg.setAttribute("height", Math.max(side + 60, y0 + rows * cell + 20));
    svg.setAttribute("viewBox", "0 0 " + svg.getAttribute("width") + " " + svg.getAttribute("height"));
  }
  const DRAW = { lines: drawLines, matrix: drawMatrix, image: drawImage, text: drawText, bars: drawBars,
                 overview: drawOverview };

  function fill(select, values, labelsOf, keep) {
    const before = select.value;
    while (select.firstChild) select.removeChild(select.firstChild);
    values.forEach((v, i) => { const o = html("option", { value: v }, select); o.textContent = labelsOf[i]; });
    if (keep && values.map(String).includes(before)) select.value = before;
  }
  function onRecord() {
    const r = cur();
    const heads = ["mean"], names = [r.heads > 1 ? "mean of " + r.heads + " heads" : "the only head"];
    for (let k = 0; k < r.heads && r.heads > 1; k++) { heads.push(String(k)); names.push("head " + k); }
    fill(selHead, heads, names, true);
    selHead.disabled = r.heads <= 1;
    const v = views(r);
    fill(selView, v, v, true);
    const q = qLabels(r);
    fill(selQuery, q.map((_, i) => i), q, false);
    draw();
  }
  function draw() {
    const r = cur();
    selQuery.disabled = !(selView.value === "image" || (selView.value === "text" && r.kind !== "pooling"));
    const layer = r.layer === null || r.layer === undefined ? "" : " \u00b7 layer " + r.layer;
    info.textContent = r.name + " \u00b7 " + r.module + " \u00b7 " + (KIND[r.kind] || r.kind) + layer + " \u00b7 " +
      r.heads + (r.heads > 1 ? " heads" : " head") + " \u00b7 " + r.tq + " \u00d7 " + r.tk +
      (r.calls > 1 ? " \u00b7 " + r.calls + " calls joined" : "") + (r.causal ? " \u00b7 causal" : "");
    DRAW[selView.value](r, big(r) ? null : matrix(r));
  }

  // ---- saving the current view (Blob URLs: nothing leaves the page)
  function download(blob, name) {
    const a = html("a", { href: URL.createObjectURL(blob), download: name }, document.body);
    a.click();
    setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }
  const svgText = () => new XMLSerializer().serializeToString(svg);
  btnSvg.addEventListener("click", () => download(new Blob([svgText()], { type: "image/svg+xml" }), "attention.svg"));
  btnPng.addEventListener("click", () => {
    const img = new Image(), url = URL.createObjectURL(new Blob([svgText()], { type: "image/svg+xml" }));
    img.onload = () => {
      const c = document.createElement("canvas");
      c.width = +svg.getAttribute("width") * 2; c.height = +svg.getAttribute("height") * 2;
      const ctx = c.getContext("2d");
      ctx.scale(2, 2); ctx.drawImage(img, 0, 0);
      URL.revokeObjectURL(url);
      c.toBlob((b) => download(b, "attention.png"), "image/png");
    };
    img.src = url;
  });

  selRec.addEventListener("change", onRecord);
  selHead.addEventListener("change", draw);
  selView.addEventListener("change", draw);
  selQuery.addEventListener("change", draw);
  onRecord();
  const show = (id, head) => {  // the main view on record id, head (a number or "mean")
    selRec.value = String(id); onRecord();
    selHead.value = String(head); draw();
    svg.scrollIntoView({ block: "nearest" });
  };
  if (window.QKV_PARTS) window.QKV_PARTS({ DATA: DATA, recs: recs, rowOf: rowOf, overviewOf: overviewOf,
                                          picture: picture, html: html, labels: labels, show: show,
                                          anchor: controls });
})();
