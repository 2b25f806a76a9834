/* attnlm explorer: experiments inside a causal decoder (models whose info says interpret: true).
 *
 * AttnInterp.ablation(els, api, ctx): the ablated heads of the page and the panel above the
 * next-token table: every change POSTs /api/ablate {text, heads: ["L.H", ...], mean, k, model}
 * and draws the plain run's top tokens with p before -> after, the ablated run's top tokens,
 * and the KL divergence. Returns {has, toggle, heads, clear, refresh}; the head view's
 * "ablate" buttons and the head-score grid call toggle.
 *
 * AttnInterp.patching(els, api, ctx): POST /api/patch {clean, corrupt, answer, wrong, model}
 * drawn as two grids (layers x positions of the residual stream, layers x heads), each cell
 * the fraction of the logit difference recovered (blue = toward the clean run, red = past the
 * corrupt one), its value on hover.
 *
 * AttnInterp.scores(els, api, ctx): POST /api/heads {kind, length, seed, model} drawn as a
 * layers x heads grid (darker = a higher score, the value on hover); a click on a cell
 * toggles that head's ablation. Answers are kept per model and settings.
 *
 * ctx: {model() -> the current model's name, text() -> the text last shown, onAblate() -> the
 * page redraws what shows the ablated heads}. Each panel keeps its own errors (one line).
 */
(function (global) {
  "use strict";

  function label(t) { return global.AttnViews.label(t); }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function say(node, msg, isError) {
    node.textContent = msg || "";
    node.className = "status" + (isError ? " error" : "");
  }

  function fmt(v, digits) { return v === null || v === undefined ? "\u2013" : v.toFixed(digits); }

  /* -1 (red) .. 0 (white) .. 1 (blue), clamped */
  function diverging(v) {
    if (v === null || v === undefined) return "#eeeeee";
    var w = Math.max(-1, Math.min(1, v));
    if (w >= 0) return global.AttnLLM.blue(w);
    var a = -w;
    return "rgb(" + [Math.round(255 - 52 * a), Math.round(255 - 231 * a), Math.round(255 - 226 * a)].join(",") + ")";
  }

  /* A grid as a table: rows (name, values), column names; colour(v), tip(row, col, v) the
     hover text; readout shows the hovered cell's tip. Each cell carries data-row, data-col,
     data-value. */
  function grid(table, rowNames, colNames, values, colour, tip, readout) {
    table.innerHTML = "";
    var head = el("thead"), hr = el("tr");
    hr.appendChild(el("th"));
    colNames.forEach(function (c) { hr.appendChild(el("th", {}, c)); });
    head.appendChild(hr);
    table.appendChild(head);
    var body = el("tbody");
    values.forEach(function (row, r) {
      var tr = el("tr", { "data-row": r });
      tr.appendChild(el("th", {}, rowNames[r]));
      row.forEach(function (v, c) {
        var td = el("td", { class: "grid-cell", "data-row": r, "data-col": c, "data-value": v });
        td.style.background = colour(v);
        td.title = tip(r, c, v);
        td.addEventListener("mouseenter", function () { readout.textContent = td.title; });
        td.addEventListener("mouseleave", function () { readout.textContent = ""; });
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    table.appendChild(body);
  }

  /* ---- head ablation --------------------------------------------------------------------- */

  /* els: {panel, heads, mean, clear, kl, table, status}. */
  function ablation(els, api, ctx) {
    var set = [], asked = 0;

    function key(l, h) { return l + "." + h; }
    function order(a, b) {
      var x = a.split(".").map(Number), y = b.split(".").map(Number);
      return x[0] - y[0] || x[1] - y[1];
    }
    function has(l, h) { return set.indexOf(key(l, h)) >= 0; }

    function toggle(l, h) {
      var i = set.indexOf(key(l, h));
      if (i >= 0) set.splice(i, 1); else set.push(key(l, h));
      set.sort(order);
      changed();
    }

    function clear() { set = []; changed(); }

    function changed() {
      ctx.onAblate();
      refresh();
    }

    function row(cells) {
      var tr = el("tr");
      cells.forEach(function (c) {
        var td = el("td", c[1] ? { class: c[1] } : {}, c[0]);
        tr.appendChild(td);
      });
      return tr;
    }

    function moved(before, after) {
      var d = after - before;
      return [(d >= 0 ? "+" : "\u2212") + Math.abs(d).toFixed(3), d >= 0 ? "up" : "down"];
    }

    function draw(r) {
      els.heads.textContent = "ablated: " + r.heads.join(", ") + " (" +
        (r.ablation === "mean" ? "each replaced by its mean over the positions" : "zeroed") + ")";
      els.kl.textContent = "KL(plain \u2016 ablated) = " + fmt(r.kl, 4) + " nats";
      var t = els.table;
      t.innerHTML = "<tr><th>#</th><th>plain top</th><th>p \u2192 ablated</th><th>change</th>" +
        "<th>ablated top</th><th>p ablated (plain)</th></tr>";
      r.top.forEach(function (a, i) {
        var b = r.top_ablated[i];
        t.appendChild(row([
          [String(i + 1)], [label(a.token)],
          [a.p.toFixed(3) + " \u2192 " + a.p_ablated.toFixed(3)], moved(a.p, a.p_ablated),
          [label(b.token)], [b.p_ablated.toFixed(3) + " (" + b.p.toFixed(3) + ")"],
        ]));
      });
    }

    /* Ask for the current heads on the text last shown (the answer of an older request is
       dropped). */
    function refresh() {
      var mine = ++asked;
      els.panel.classList.toggle("hidden", set.length === 0);
      if (!set.length) return Promise.resolve();
      say(els.status, "computing\u2026");
      var body = { text: ctx.text(), heads: set.slice(), mean: els.mean.checked, model: ctx.model() };
      return api("ablate", body).then(function (r) {
        if (mine !== asked) return;
        draw(r);
        say(els.status, "");
      }, function (e) {
        if (mine !== asked) return;
        els.table.innerHTML = "";
        els.kl.textContent = "";
        say(els.status, e.message, true);
      });
    }

    els.mean.addEventListener("change", refresh);
    els.clear.addEventListener("click", clear);
    return {
      has: has, toggle: toggle, clear: clear, refresh: refresh,
      heads: function () { return set.slice(); },
      reset: function () { set = []; asked++; els.panel.classList.add("hidden"); },
    };
  }

  /* ---- activation patching --------------------------------------------------------------- */

  /* els: {clean, corrupt, answer, wrong, run, status, summary, resid, heads, readout}. */
  function patching(els, api, ctx) {
    var asked = 0;

    function draw(r) {
      els.summary.textContent = "logit difference \u201c" + label(r.answer) + "\u201d \u2212 \u201c" +
        label(r.wrong) + "\u201d at the last position: clean " + fmt(r.clean_logit_diff, 3) +
        ", corrupt " + fmt(r.corrupt_logit_diff, 3) + ". Each cell: the fraction of it " +
        "recovered by patching that activation from the clean run into the corrupt one " +
        "(1 = the clean run's, 0 = the corrupt run's).";
      var layers = r.resid.map(function (_, l) { return "layer " + l; });
      grid(els.resid, layers, r.tokens.map(label), r.resid, diverging, function (l, i, v) {
        return "residual stream into layer " + l + " at position " + i + " \u201c" +
          label(r.tokens[i]) + "\u201d: " + fmt(v, 4);
      }, els.readout);
      var names = r.heads[0].map(function (_, h) { return "H" + h; });
      grid(els.heads, layers, names, r.heads, diverging, function (l, h, v) {
        return "layer " + l + ", head " + h + " (every position): " + fmt(v, 4);
      }, els.readout);
    }

    function run() {
      var mine = ++asked;
      var body = { clean: els.clean.value, corrupt: els.corrupt.value, answer: els.answer.value,
        wrong: els.wrong.value, model: ctx.model() };
      say(els.status, "computing\u2026");
      return api("patch", body).then(function (r) {
        if (mine !== asked) return;
        draw(r);
        say(els.status, "");
      }, function (e) {
        if (mine !== asked) return;
        els.summary.textContent = "";
        els.resid.innerHTML = "";
        els.heads.innerHTML = "";
        say(els.status, e.message, true);
      });
    }

    els.run.addEventListener("click", run);
    return {
      run: run,
      reset: function () {
        asked++;
        ["summary", "readout", "status"].forEach(function (k) { els[k].textContent = ""; });
        els.resid.innerHTML = "";
        els.heads.innerHTML = "";
      },
    };
  }

  /* ---- head scores ----------------------------------------------------------------------- */

  /* els: {kind, length, seed, run, status, table, readout}; abl: the ablation controller. */
  function scores(els, api, ctx, abl) {
    var asked = 0, cache = {}, shown = null;

    function settings() {
      var body = { kind: els.kind.value, model: ctx.model() };
      var n = parseInt(els.length.value, 10), s = parseInt(els.seed.value, 10);
      if (isFinite(n)) body.length = n;
      if (isFinite(s)) body.seed = s;
      return body;
    }

    function draw(r) {
      shown = r;
      var layers = r.scores.map(function (_, l) { return "layer " + l; });
      var heads = r.scores[0].map(function (_, h) { return "H" + h; });
      grid(els.table, layers, heads, r.scores, function (v) {
        return global.AttnLLM.blue(v === null ? 0 : v);
      }, function (l, h, v) {
        return "layer " + l + ", head " + h + ": " + r.kind + " score " + fmt(v, 4) +
          " (click: ablate this head)";
      }, els.readout);
      marks();
      els.table.querySelectorAll("td.grid-cell").forEach(function (td) {
        td.addEventListener("click", function () {
          abl.toggle(+td.getAttribute("data-row"), +td.getAttribute("data-col"));
        });
      });
    }

    /* Outline the cells of the ablated heads. */
    function marks() {
      if (!shown) return;
      els.table.querySelectorAll("td.grid-cell").forEach(function (td) {
        var on = abl.has(+td.getAttribute("data-row"), +td.getAttribute("data-col"));
        td.classList.toggle("ablated", on);
      });
    }

    /* One request per model and settings: the answer (or the request in flight) is kept. */
    function run() {
      var body = settings(), k = JSON.stringify(body), mine = ++asked;
      if (!cache[k]) {
        say(els.status, "computing\u2026");
        cache[k] = api("heads", body);
        cache[k].catch(function () { delete cache[k]; }); // a refusal is asked again
      }
      return cache[k].then(function (r) {
        if (mine !== asked) return;
        draw(r);
        say(els.status, "");
      }, function (e) {
        if (mine !== asked) return;
        shown = null;
        els.table.innerHTML = "";
        say(els.status, e.message, true);
      });
    }

    els.run.addEventListener("click", run);
    els.kind.addEventListener("change", run);
    return {
      run: run, marks: marks,
      reset: function () { asked++; shown = null; els.table.innerHTML = ""; say(els.status, ""); },
    };
  }

  global.AttnInterp = { ablation: ablation, patching: patching, scores: scores, diverging: diverging };
})(window);
