/* attnlm attention views: head view (SVG lines) and model view (canvas heatmaps).
 *
 * No dependencies and no network: used by the explorer page and inlined into standalone HTML
 * files. A record is {"tokens": [T], "attention": [L][H][T][T]} (rows = queries, columns =
 * keys), optionally with "source_tokens": [S] and "cross_attention": [L][H][T][S] (query =
 * target token, key = source token) for translation models.
 *
 * AttnViews.mount(root, record, state, onChange, extras) builds the controls and the current view
 * inside root and returns {state, render, toPNG}; onChange(state), if given, is called after
 * every drawing (the explorer keeps its URL in step). state: {view: "head"|"model", kind:
 * "self"|"cross", layer, heads: [indices shown in the head view], layers_filter, heads_filter,
 * focus, enlarged}. extras (the served page only; a standalone file has none): {ablation:
 * {has(layer, head), toggle(layer, head)}} adds an "ablate" button per head of the head view's
 * layer, on while that head is ablated (the page then shows the next-token distribution
 * without it).
 */
(function (global) {
  "use strict";

  var SVG_NS = "http://www.w3.org/2000/svg"; // an XML namespace name, never fetched
  var LINE_MIN = 0.01; // head view: weights below this draw no line
  var COLORS = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#843c39", "#7b4173", "#3182bd",
  ];

  function headColor(h) {
    if (h < COLORS.length) return COLORS[h];
    return "hsl(" + ((h * 137.508) % 360).toFixed(1) + ",65%,45%)";
  }

  function label(tok) {
    if (tok === "") return "\u2205";
    return tok.replace(/ /g, "\u2423").replace(/\n/g, "\\n").replace(/\t/g, "\\t");
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svgEl(tag, attrs, text) {
    var e = document.createElementNS(SVG_NS, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /* "0,2-4" -> [0,2,3,4] within [0, n); "" or "all" -> all. Bad parts are ignored. */
  function parseRange(spec, n) {
    var all = [];
    for (var i = 0; i < n; i++) all.push(i);
    spec = (spec || "").trim();
    if (spec === "" || spec === "all") return all;
    var out = {};
    spec.split(",").forEach(function (part) {
      var m = part.trim().match(/^(\d+)(?:\s*-\s*(\d+))?$/);
      if (!m) return;
      var a = +m[1], b = m[2] === undefined ? a : +m[2];
      for (var j = Math.min(a, b); j <= Math.max(a, b) && j < n; j++) out[j] = true;
    });
    return all.filter(function (j) { return out[j]; });
  }

  function parts(record, kind) {
    if (kind === "cross" && record.cross_attention) {
      return { queries: record.tokens, keys: record.source_tokens, maps: record.cross_attention };
    }
    return { queries: record.tokens, keys: record.tokens, maps: record.attention };
  }

  function nHeads(maps) { return maps.length ? maps[0].length : 0; }

  /* ---- head view ------------------------------------------------------------------------ */

  function drawHeadView(box, record, state, rerender) {
    var p = parts(record, state.kind);
    var layer = Math.min(state.layer, p.maps.length - 1);
    var Q = p.queries.length, K = p.keys.length;
    var rowH = 20, top = 10, colW = 150, gap = 220;
    var height = top * 2 + rowH * Math.max(Q, K);
    var width = colW * 2 + gap;
    var svg = svgEl("svg", {
      xmlns: SVG_NS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
      class: "head-view", "font-family": "DejaVu Sans Mono, Menlo, Consolas, monospace",
      "font-size": "13",
    });
    svg.appendChild(svgEl("rect", { x: 0, y: 0, width: width, height: height, fill: "#ffffff" }));
    var xL = colW, xR = colW + gap;
    var y = function (i) { return top + rowH * i + rowH / 2; };
    var lines = svgEl("g", { class: "lines" });
    svg.appendChild(lines);
    var texts = { q: [], k: [] };
    // Hovering redraws only the lines and the token styles, never the token elements
    // themselves (replacing the element under the pointer would fire mouseenter again).
    function drawLines() {
      var focus = state.focus;
      while (lines.firstChild) lines.removeChild(lines.firstChild);
      var shown = state.heads.filter(function (h) { return h < nHeads(p.maps); });
      shown.forEach(function (h, hi) {
        var m = p.maps[layer][h], color = headColor(h);
        var dy = (hi - (shown.length - 1) / 2) * 1.5; // heads side by side, not on top
        for (var q = 0; q < Q; q++) {
          if (focus && focus.side === "q" && focus.index !== q) continue;
          for (var k = 0; k < K; k++) {
            if (focus && focus.side === "k" && focus.index !== k) continue;
            var w = m[q][k];
            if (!(w >= LINE_MIN)) continue;
            lines.appendChild(svgEl("line", {
              class: "attn", "data-head": h, "data-q": q, "data-k": k, "data-w": w,
              x1: xL + 4, y1: y(q) + dy, x2: xR - 4, y2: y(k) + dy, stroke: color,
              "stroke-opacity": Math.min(1, 0.1 + 0.9 * Math.sqrt(w)).toFixed(3), "stroke-width": (1 + 3 * w).toFixed(2),
            }));
          }
        }
      });
      ["q", "k"].forEach(function (side) {
        texts[side].forEach(function (t, i) {
          var on = focus && focus.side === side && focus.index === i;
          t.setAttribute("fill", on ? "#000000" : "#333333");
          t.setAttribute("font-weight", on ? "bold" : "normal");
        });
      });
    }
    function tokenColumn(tokens, x, side, anchor) {
      tokens.forEach(function (t, i) {
        var txt = svgEl("text", {
          class: "tok tok-" + side, "data-index": i, x: x, y: y(i) + 4, "text-anchor": anchor,
        }, label(t));
        txt.addEventListener("mouseenter", function () {
          state.focus = { side: side, index: i };
          drawLines();
        });
        txt.addEventListener("mouseleave", function () {
          state.focus = null;
          drawLines();
        });
        texts[side].push(txt);
        svg.appendChild(txt);
      });
    }
    tokenColumn(p.queries, xL - 6, "q", "end");
    tokenColumn(p.keys, xR + 6, "k", "start");
    drawLines();
    box.appendChild(svg);
  }

  /* ---- model view ----------------------------------------------------------------------- */

  function heatCanvas(m, Q, K, size) {
    var src = document.createElement("canvas");
    src.width = K; src.height = Q;
    var ctx = src.getContext("2d");
    var img = ctx.createImageData(K, Q), d = img.data;
    for (var q = 0; q < Q; q++) {
      for (var k = 0; k < K; k++) {
        var w = Math.max(0, Math.min(1, m[q][k])), o = 4 * (q * K + k);
        d[o] = Math.round(255 - 247 * w); d[o + 1] = Math.round(255 - 207 * w);
        d[o + 2] = Math.round(255 - 148 * w); d[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    var c = document.createElement("canvas");
    var scale = size / Math.max(Q, K);
    c.width = Math.max(1, Math.round(K * scale)); c.height = Math.max(1, Math.round(Q * scale));
    var cx = c.getContext("2d");
    cx.imageSmoothingEnabled = false;
    cx.drawImage(src, 0, 0, c.width, c.height);
    return c;
  }

  function drawModelView(box, record, state, rerender) {
    var p = parts(record, state.kind);
    var Q = p.queries.length, K = p.keys.length;
    var layers = parseRange(state.layers_filter, p.maps.length);
    var heads = parseRange(state.heads_filter, nHeads(p.maps));
    var cell = Math.max(48, Math.min(120, Math.floor(900 / Math.max(1, heads.length)) - 8));
    var grid = el("div", { class: "model-grid" });
    grid.style.gridTemplateColumns = "repeat(" + heads.length + ", " + (cell + 6) + "px)";
    layers.forEach(function (l) {
      heads.forEach(function (h) {
        var fig = el("figure", { class: "cell", "data-layer": l, "data-head": h });
        var c = heatCanvas(p.maps[l][h], Q, K, cell);
        c.className = "thumb";
        c.title = "layer " + l + ", head " + h + ": click to enlarge";
        c.addEventListener("click", function () {
          state.enlarged = { layer: l, head: h };
          rerender();
        });
        fig.appendChild(c);
        fig.appendChild(el("figcaption", {}, "L" + l + " H" + h));
        grid.appendChild(fig);
      });
    });
    box.appendChild(grid);
    if (state.enlarged && state.enlarged.layer < p.maps.length && state.enlarged.head < nHeads(p.maps)) {
      box.appendChild(enlarged(p, state, rerender));
    }
  }

  function enlarged(p, state, rerender) {
    var l = state.enlarged.layer, h = state.enlarged.head;
    var Q = p.queries.length, K = p.keys.length, m = p.maps[l][h];
    var wrap = el("div", { class: "enlarged" });
    var head = el("div", { class: "enlarged-head" }, "layer " + l + ", head " + h + " (rows: queries, columns: keys) ");
    var close = el("button", { type: "button", class: "close" }, "close");
    close.addEventListener("click", function () { state.enlarged = null; rerender(); });
    head.appendChild(close);
    wrap.appendChild(head);
    var cellPx = Math.max(4, Math.min(28, Math.floor(560 / Math.max(Q, K))));
    var margin = 110, W = margin + K * cellPx + 10, H = margin + Q * cellPx + 10;
    var c = document.createElement("canvas");
    c.width = W; c.height = H; c.className = "big";
    var ctx = c.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    ctx.drawImage(heatCanvas(m, Q, K, Math.max(Q, K) * cellPx), margin, margin);
    ctx.fillStyle = "#222";
    ctx.font = Math.min(12, cellPx) + "px DejaVu Sans Mono, Menlo, Consolas, monospace";
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    p.queries.forEach(function (t, i) { ctx.fillText(label(t), margin - 4, margin + (i + 0.5) * cellPx); });
    p.keys.forEach(function (t, i) {
      ctx.save();
      ctx.translate(margin + (i + 0.5) * cellPx, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(label(t), 0, 0);
      ctx.restore();
    });
    var tip = el("div", { class: "tip" });
    tip.style.display = "none";
    c.addEventListener("mousemove", function (ev) {
      var r = c.getBoundingClientRect();
      var x = (ev.clientX - r.left) * (c.width / r.width) - margin;
      var y = (ev.clientY - r.top) * (c.height / r.height) - margin;
      var k = Math.floor(x / cellPx), q = Math.floor(y / cellPx);
      if (q < 0 || k < 0 || q >= Q || k >= K) { tip.style.display = "none"; return; }
      tip.textContent = label(p.queries[q]) + " \u2192 " + label(p.keys[k]) + ": " + m[q][k].toFixed(4);
      tip.style.display = "block";
      tip.style.left = (ev.clientX - r.left + 14) + "px";
      tip.style.top = (ev.clientY - r.top + 14) + "px";
    });
    c.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    var holder = el("div", { class: "big-holder" });
    holder.appendChild(c);
    holder.appendChild(tip);
    wrap.appendChild(holder);
    return wrap;
  }

  /* ---- controls and mounting ------------------------------------------------------------ */

  /* A record with cross-attention but no self-attention (an RNN encoder-decoder). */
  function crossOnly(record) {
    return !!record.cross_attention && !(record.attention && record.attention.length);
  }

  function defaults(record, state) {
    var s = {
      view: "head", kind: "self", layer: 0, heads: null, layers_filter: "", heads_filter: "",
      focus: null, enlarged: null,
    };
    for (var k in state || {}) if (state[k] !== undefined && state[k] !== null) s[k] = state[k];
    if (s.view !== "model") s.view = "head";
    if (s.kind === "cross" && !record.cross_attention) s.kind = "self";
    if (crossOnly(record)) s.kind = "cross";
    var p = parts(record, s.kind);
    if (s.layer >= p.maps.length) s.layer = 0;
    var T = p.queries.length, H = nHeads(p.maps);
    // long inputs: start with one head in the head view and one layer in the model view
    if (!s.heads) s.heads = parseRange(T * T * H > 100000 ? "0" : "", H);
    if (!s.layers_filter && T * T * H * p.maps.length > 2000000) s.layers_filter = "0";
    return s;
  }

  /* The head view's ablation toggles: one button per head of the shown layer. */
  function ablateButtons(ablation, layer, n, render) {
    var box = el("span", { class: "ablate-heads", title: "ablate a head (zero its output): the " +
      "next-token table shows the distribution without it; click again to restore it" });
    box.appendChild(el("span", { class: "ablate-label" }, "ablate"));
    for (var h = 0; h < n; h++) {
      (function (h) {
        var on = ablation.has(layer, h);
        var b = el("button", { type: "button", class: "ablate-head" + (on ? " on" : ""),
          "data-layer": layer, "data-head": h, "aria-pressed": on ? "true" : "false" }, String(h));
        b.style.borderColor = headColor(h);
        b.addEventListener("click", function () { ablation.toggle(layer, h); render(); });
        box.appendChild(b);
      })(h);
    }
    return box;
  }

  function mount(root, record, initial, onChange, extras) {
    var state = defaults(record, initial);
    root.innerHTML = "";
    var bar = el("div", { class: "view-bar" });
    var body = el("div", { class: "view-body" });
    root.appendChild(bar);
    root.appendChild(body);

    function render() {
      var p = parts(record, state.kind);
      bar.innerHTML = "";
      ["head", "model"].forEach(function (v) {
        var b = el("button", { type: "button", class: "tab" + (state.view === v ? " on" : ""), "data-view": v },
          v === "head" ? "Head view" : "Model view");
        b.addEventListener("click", function () { state.view = v; state.focus = null; render(); });
        bar.appendChild(b);
      });
      if (record.cross_attention && !crossOnly(record)) {
        var kind = el("select", { class: "kind-select", title: "which attention" });
        [["self", "self-attention"], ["cross", "cross-attention (target \u2192 source)"]].forEach(function (o) {
          var opt = el("option", { value: o[0] }, o[1]);
          if (o[0] === state.kind) opt.selected = true;
          kind.appendChild(opt);
        });
        kind.addEventListener("change", function () { state.kind = kind.value; state.focus = null; render(); });
        bar.appendChild(kind);
      }
      if (state.view === "head") {
        var ls = el("select", { class: "layer-select", title: "layer" });
        for (var l = 0; l < p.maps.length; l++) {
          var o = el("option", { value: l }, "layer " + l);
          if (l === state.layer) o.selected = true;
          ls.appendChild(o);
        }
        ls.addEventListener("change", function () { state.layer = +ls.value; render(); });
        bar.appendChild(ls);
        var sw = el("span", { class: "swatches", title: "heads: click to show/hide, double-click to show only that one" });
        for (var h = 0; h < nHeads(p.maps); h++) {
          (function (h) {
            var on = state.heads.indexOf(h) >= 0;
            var b = el("button", { type: "button", class: "head-swatch" + (on ? " on" : ""), "data-head": h }, String(h));
            b.style.background = on ? headColor(h) : "#fff";
            b.style.borderColor = headColor(h);
            b.addEventListener("click", function () {
              var i = state.heads.indexOf(h);
              if (i >= 0) state.heads.splice(i, 1); else state.heads.push(h);
              state.heads.sort(function (a, b) { return a - b; });
              render();
            });
            b.addEventListener("dblclick", function () { state.heads = [h]; render(); });
            sw.appendChild(b);
          })(h);
        }
        bar.appendChild(sw);
        [["all", parseRange("", nHeads(p.maps))], ["none", []]].forEach(function (a) {
          var b = el("button", { type: "button", class: "heads-" + a[0] }, a[0]);
          b.addEventListener("click", function () { state.heads = a[1].slice(); render(); });
          bar.appendChild(b);
        });
        if (extras && extras.ablation && state.kind === "self") {
          bar.appendChild(ablateButtons(extras.ablation, state.layer, nHeads(p.maps), render));
        }
      } else {
        [["layers", "layers_filter"], ["heads", "heads_filter"]].forEach(function (f) {
          var lab = el("label", {}, f[0] + " ");
          var inp = el("input", { type: "text", class: "filter-" + f[0], placeholder: "all, or e.g. 0,2-3", size: 12 });
          inp.value = state[f[1]];
          inp.addEventListener("change", function () { state[f[1]] = inp.value; render(); });
          lab.appendChild(inp);
          bar.appendChild(lab);
        });
      }
      var png = el("button", { type: "button", class: "save-png" }, "Save PNG");
      png.addEventListener("click", function () {
        toPNG().then(function (blob) { download(blob, "attention-" + state.view + ".png"); });
      });
      bar.appendChild(png);
      body.innerHTML = "";
      if (state.view === "head") drawHeadView(body, record, state, render);
      else drawModelView(body, record, state, render);
      if (onChange) onChange(state);
    }

    function toPNG() {
      if (state.view === "head") {
        var svg = body.querySelector("svg");
        var xml = new XMLSerializer().serializeToString(svg);
        var url = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(xml);
        return new Promise(function (resolve, reject) {
          var img = new Image();
          img.onload = function () {
            var c = document.createElement("canvas");
            c.width = svg.width.baseVal.value * 2; c.height = svg.height.baseVal.value * 2;
            var ctx = c.getContext("2d");
            ctx.scale(2, 2);
            ctx.drawImage(img, 0, 0);
            c.toBlob(resolve, "image/png");
          };
          img.onerror = reject;
          img.src = url;
        });
      }
      var big = body.querySelector("canvas.big");
      var cells = body.querySelectorAll("figure.cell");
      var c = document.createElement("canvas");
      if (big) {
        c = big;
      } else {
        var grid = body.querySelector(".model-grid").getBoundingClientRect();
        c.width = Math.ceil(grid.width); c.height = Math.ceil(grid.height);
        var ctx = c.getContext("2d");
        ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height);
        ctx.fillStyle = "#222"; ctx.font = "11px sans-serif"; ctx.textBaseline = "top";
        cells.forEach(function (f) {
          var r = f.getBoundingClientRect(), t = f.querySelector("canvas");
          var tr = t.getBoundingClientRect();
          ctx.drawImage(t, tr.left - grid.left, tr.top - grid.top);
          ctx.fillText(f.querySelector("figcaption").textContent, r.left - grid.left, tr.bottom - grid.top + 2);
        });
      }
      return new Promise(function (resolve) { c.toBlob(resolve, "image/png"); });
    }

    render();
    return { state: state, record: record, render: render, toPNG: toPNG };
  }

  function download(blob, name) {
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    setTimeout(function () { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }

  /* A standalone offline HTML document for record (template: standalone.html). */
  function standaloneHTML(template, css, js, record, state, title) {
    var esc = function (s) {
      return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
    };
    var json = function (v) { return JSON.stringify(v).replace(/</g, "\\u003c"); };
    var st = {};
    ["view", "kind", "layer", "heads", "layers_filter", "heads_filter"].forEach(function (k) { st[k] = state[k]; });
    var values = { TITLE: esc(title), STYLE: css, SCRIPT: js, RECORD: json(record), STATE: json(st) };
    // one pass: substituted text is never scanned again for placeholders
    return template.replace(/\{\{(TITLE|STYLE|SCRIPT|RECORD|STATE)\}\}/g, function (_, k) { return values[k]; });
  }

  global.AttnViews = {
    LINE_MIN: LINE_MIN, headColor: headColor, label: label, parseRange: parseRange,
    mount: mount, download: download, standaloneHTML: standaloneHTML,
  };
})(window);
