/* attnlm explorer page: talks to the local JSON API (same origin only) and draws the views. */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var models = {}, current = null, view = null, lastRecord = null, runs = 0;
  var sampleText = null, sampleNote = ""; // the text box holds the sample until edited
  var chatPanel = null;
  var ablation = null, patching = null, scores = null; // a causal decoder's experiments
  var shownText = ""; // the text of the last run: the ablation is asked on it

  function api(path, body) {
    var opts = body === undefined ? {} : {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    };
    return fetch("/api/" + path, opts).then(function (r) {
      return r.json().catch(function () { return { error: "bad answer (HTTP " + r.status + ")" }; })
        .then(function (data) {
          if (!r.ok) throw new Error(data.error || "HTTP " + r.status);
          return data;
        });
    });
  }

  function status(msg, isError) {
    var s = $("status");
    s.textContent = msg || "";
    s.className = "status" + (isError ? " error" : "");
  }

  function has(cap) { return current && current.capabilities.indexOf(cap) >= 0; }

  function showModel(name) {
    current = models[name];
    var m = current;
    $("model-info").textContent = m.family + " \u00b7 " + m.n_layer + " layers \u00d7 " + m.n_head +
      " heads" + (m.window ? " \u00b7 window " + m.window + " tokens" : "") + " \u00b7 " +
      m.parameters.toLocaleString() +
      " parameters \u00b7 " + (m.capabilities.join(", ") || "attention only");
    $("input-title").textContent = has("translate") ? "Source sentence" : "Text";
    $("next").classList.toggle("hidden", !has("generate"));
    $("generate").classList.toggle("hidden", !has("generate"));
    $("fillmask").classList.toggle("hidden", !has("fill-mask"));
    $("translate").classList.toggle("hidden", !has("translate"));
    $("embed").classList.toggle("hidden", has("translate"));
    $("lens").classList.toggle("hidden", !m.lens);
    $("chat").classList.toggle("hidden", !m.chat);
    $("scores").classList.toggle("hidden", !m.interpret);
    $("patching").classList.toggle("hidden", !m.interpret);
    if (chatPanel) chatPanel.reset(); // a conversation belongs to the model that had it
    if (ablation) { ablation.reset(); patching.reset(); scores.reset(); } // so do heads
    // the repeated random sequences (2 x length tokens) must fit the model's window
    $("hs-length").value = m.window ? Math.max(1, Math.min(20, Math.floor(m.window / 2))) : 20;
    if (scores && m.interpret) scores.run();
  }

  /* The model's own sample text (trimmed by the server to fit its window), and why. */
  function useSample() {
    var s = current.sample || { text: $("text").value, note: "" };
    $("text").value = s.text;
    sampleText = s.text;
    sampleNote = s.note;
  }

  function renderTokens(tokens) {
    var box = $("tokens");
    box.innerHTML = "";
    tokens.forEach(function (t, i) {
      var s = document.createElement("span");
      s.textContent = AttnViews.label(t);
      var n = document.createElement("small");
      n.textContent = i;
      s.appendChild(n);
      box.appendChild(s);
    });
  }

  /* Only the attention record's keys (a translate answer also carries the translation). */
  function recordOf(r) {
    var rec = { tokens: r.tokens, attention: r.attention };
    if (r.cross_attention) { rec.source_tokens = r.source_tokens; rec.cross_attention = r.cross_attention; }
    return rec;
  }

  function showRecord(answer) {
    var rec = recordOf(answer);
    lastRecord = rec;
    renderTokens(rec.tokens);
    $("attention").classList.remove("hidden");
    var keep = view ? view.state : {};
    var st = {
      view: keep.view, kind: keep.kind, layers_filter: keep.layers_filter, heads_filter: keep.heads_filter,
      layer: keep.layer, heads: keep.heads ? keep.heads.slice() : null,
    };
    var extras = current.interpret ? { ablation: ablation } : null;
    view = AttnViews.mount($("views"), rec, st, writeHash, extras);
    window.attnView = view;
  }

  /* The URL keeps the view: #text=...&model=...&view=...&layer=...&heads=0,2&... (the text,
     the model, the view's settings and the translation settings), so a view can be shared
     and reloaded. replaceState: no history entry per change. */
  var VIEW_KEYS = ["view", "kind", "layer", "heads", "layers_filter", "heads_filter"];
  var TRANSLATE_KEYS = { temperature: "t-temperature", seed: "t-seed", max_new_tokens: "t-max",
    num_beams: "t-beams" };

  function writeHash() {
    if (!current) return;
    var q = new URLSearchParams();
    q.set("text", $("text").value);
    q.set("model", current.name);
    var st = view ? view.state : {};
    VIEW_KEYS.forEach(function (k) {
      var v = st[k];
      if (v === undefined || v === null || v === "") return;
      q.set(k, Array.isArray(v) ? v.join(",") : String(v));
    });
    if (has("translate")) {
      Object.keys(TRANSLATE_KEYS).forEach(function (k) {
        var v = $(TRANSLATE_KEYS[k]).value.trim();
        if (v !== "") q.set(k, v);
      });
    }
    var hash = "#" + q.toString();
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  /* Apply a #text=... hash: the model, the text, the translation settings, and the view state
     the next drawing starts from. Returns whether the hash named anything. */
  function readHash() {
    var q = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (!q.has("text") && !q.has("model")) return false;
    if (q.has("model") && models[q.get("model")]) {
      $("model").value = q.get("model");
      showModel(q.get("model"));
    }
    if (q.has("text")) $("text").value = q.get("text");
    Object.keys(TRANSLATE_KEYS).forEach(function (k) {
      if (q.has(k)) $(TRANSLATE_KEYS[k]).value = q.get(k);
    });
    var st = {};
    VIEW_KEYS.forEach(function (k) {
      if (!q.has(k)) return;
      var v = q.get(k);
      if (k === "layer") st[k] = parseInt(v, 10) || 0;
      else if (k === "heads") st[k] = v === "" ? [] : v.split(",").map(Number).filter(isFinite);
      else st[k] = v;
    });
    view = { state: st }; // showRecord starts the next drawing from it
    return true;
  }

  /* The attention was refused (a text too long for its answer): hide the old record and show
     the new text's tokens, so the page never shows another text's attention. */
  function noRecord(text, model, latest) {
    return api("tokens", { text: text, model: model }).then(latest(function (r) {
      lastRecord = null;
      $("attention").classList.add("hidden");
      renderTokens(r.tokens);
    }), function () {});
  }

  /* Answers of an older run (the model was switched, or the button pressed again) are
     dropped, so the page always shows the latest request's record. */
  function run() {
    var text = $("text").value, model = current.name, mine = ++runs;
    shownText = text;
    var latest = function (fn) { return function (r) { if (mine === runs) fn(r); }; };
    status("computing\u2026");
    var jobs = [];
    if (has("translate")) {
      var body = { text: text, model: model, temperature: num("t-temperature") || 0, seed: num("t-seed") };
      var max = num("t-max"), beams = num("t-beams");
      if (max) body.max_new_tokens = max;
      if (beams && beams > 1) body.num_beams = beams;
      jobs.push(api("translate", body).then(latest(function (r) {
        $("translation").textContent = r.translation === "" ? "(empty translation)" : r.translation;
        showRecord(r);
      })));
    } else {
      jobs.push(api("attention", { text: text, model: model }).then(latest(showRecord), function (e) {
        return noRecord(text, model, latest).then(function () { throw e; });
      }));
    }
    if (has("generate")) jobs.push(nextTokens());
    if (current.lens) jobs.push(lens(latest));
    if (current.interpret) ablation.refresh(); // its errors stay in its panel
    var note = text === sampleText ? sampleNote : "";
    Promise.all(jobs).then(latest(function () { status(note); }), latest(function (e) { status(e.message, true); }));
  }

  // one table row: two label cells, then each candidate token with a probability bar
  function candidateRow(first, second, cands) {
    var tr = document.createElement("tr");
    var a = document.createElement("td"); a.textContent = first;
    var b = document.createElement("td"); b.textContent = second;
    var c = document.createElement("td");
    cands.forEach(function (cand) {
      var s = document.createElement("span");
      s.className = "cand";
      var bar = document.createElement("span");
      bar.className = "bar";
      bar.style.width = Math.max(1, Math.round(cand.prob * 60)) + "px";
      s.appendChild(bar);
      s.appendChild(document.createTextNode(AttnViews.label(cand.token) + " " + cand.prob.toFixed(3)));
      c.appendChild(s);
    });
    tr.appendChild(a); tr.appendChild(b); tr.appendChild(c);
    return tr;
  }

  function nextTokens() {
    var k = parseInt($("next-k").value, 10) || 5;
    return api("next_tokens", { text: $("text").value, model: current.name, k: k }).then(function (r) {
      var t = $("next-table");
      t.innerHTML = "<tr><th>#</th><th>token</th><th>most likely next tokens</th></tr>";
      r.tokens.forEach(function (tok, i) {
        t.appendChild(candidateRow(i, AttnViews.label(tok), r.next[i]));
      });
    });
  }

  /* The lens's own errors (a text too long for it) stay in its panel: the other views draw. */
  function lens(latest) {
    var k = parseInt($("lens-k").value, 10) || 5;
    $("lens-note").textContent = "";
    return api("lens", { text: $("text").value, model: current.name, k: k }).then(latest(function (r) {
      AttnLLM.drawLens($("lens-grid"), r);
    }), latest(function (e) {
      $("lens-grid").innerHTML = "";
      $("lens-note").textContent = e.message;
      $("lens-note").className = "status error";
    }));
  }

  function num(id) {
    var v = $(id).value.trim();
    return v === "" ? null : Number(v);
  }

  function generate() {
    var topK = num("g-top-k"), topP = num("g-top-p"), seed = num("g-seed");
    var body = {
      text: $("text").value, model: current.name,
      temperature: num("g-temperature") || 0, max_new_tokens: num("g-max") || 50,
      top_k: topK ? topK : null, top_p: topP && topP < 1 ? topP : null,
      seed: seed === null ? null : seed,
    };
    $("g-out").textContent = "generating\u2026";
    api("generate", body).then(function (r) {
      var out = $("g-out");
      out.innerHTML = "";
      var b = document.createElement("b");
      b.textContent = r.prompt;
      out.appendChild(b);
      out.appendChild(document.createTextNode(r.continuation));
    }, function (e) { $("g-out").textContent = "error: " + e.message; });
  }

  /* One row per [MASK]: its position in the model input and the top-k tokens with bars. */
  function fillMask() {
    var k = parseInt($("fm-k").value, 10) || 5, out = $("fm-out");
    out.textContent = "computing\u2026";
    api("fill_mask", { text: $("text").value, model: current.name, k: k }).then(function (r) {
      out.innerHTML = "";
      var p = document.createElement("p");
      p.className = "output filled";
      p.textContent = r.filled;
      out.appendChild(p);
      var t = document.createElement("table");
      t.className = "next masks";
      t.innerHTML = "<tr><th>#</th><th>position</th><th>most likely tokens</th></tr>";
      r.masks.forEach(function (m, i) {
        t.appendChild(candidateRow("[MASK] " + (i + 1), m.index, m.predictions));
      });
      out.appendChild(t);
    }, function (e) { out.textContent = "error: " + e.message; });
  }

  // The word2vec half of the lesson (attnlm serve --vectors): one vector per word type.
  function staticNote(st) {
    var p = document.createElement("p");
    p.className = "note static-word";
    if (st.error) {
      p.textContent = "static word2vec vector: " + st.error;
      return p;
    }
    p.textContent = "static word2vec vector of \u201c" + st.word + "\u201d: one vector for the " +
      "word type, so its cosine between the two sentences is " + st.cosine.toFixed(4) +
      " whatever the context; nearest words: " + st.neighbours.map(function (n) {
        return n[0] + " (" + n[1].toFixed(2) + ")";
      }).join(", ") + ". The contextual vectors below drift with the context:";
    return p;
  }

  function embeddings() {
    var body = { word: $("e-word").value, sentences: [$("e-s1").value, $("e-s2").value], model: current.name };
    var out = $("e-out");
    out.textContent = "computing\u2026";
    api("embeddings", body).then(function (r) {
      out.innerHTML = "";
      var p = document.createElement("p");
      p.className = "note";
      p.textContent = "tokens of \u201c" + r.word + "\u201d: " + r.found.map(function (f, i) {
        return "sentence " + (i + 1) + " " + f.tokens.map(AttnViews.label).join(" ");
      }).join("; ") + ". Cosine similarity of its two vectors at every layer (0 = embeddings):";
      out.appendChild(p);
      if (r.static) { out.appendChild(staticNote(r.static)); }
      var t = document.createElement("table");
      t.className = "cos-chart";
      r.cosine.forEach(function (c, l) {
        var tr = document.createElement("tr");
        var a = document.createElement("td"); a.textContent = l === 0 ? "embeddings" : "layer " + l;
        var b = document.createElement("td");
        var bar = document.createElement("span");
        bar.className = "cbar";
        bar.style.width = Math.max(1, Math.round(Math.max(0, c) * 240)) + "px";
        b.appendChild(bar);
        var v = document.createElement("td"); v.textContent = c.toFixed(4);
        tr.appendChild(a); tr.appendChild(b); tr.appendChild(v);
        t.appendChild(tr);
      });
      out.appendChild(t);
    }, function (e) { out.textContent = "error: " + e.message; });
  }

  /* The current record and view as a standalone offline HTML document (a string). */
  function buildStandalone() {
    var files = ["standalone.html", "style.css", "views.js", "standalone.js"];
    return Promise.all(files.map(function (f) {
      return fetch("/static/" + f).then(function (r) { return r.text(); });
    })).then(function (t) {
      var title = "Attention: " + current.name;
      return AttnViews.standaloneHTML(t[0], t[1], t[2] + "\n" + t[3], lastRecord, view.state, title);
    });
  }

  function saveHTML() {
    if (!lastRecord || !view) return;
    buildStandalone().then(function (html) {
      AttnViews.download(new Blob([html], { type: "text/html" }), "attention.html");
    }, function (e) { status(e.message, true); });
  }

  function init() {
    $("run").addEventListener("click", run);
    $("text").addEventListener("keydown", function (e) {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run();
    });
    $("next-k").addEventListener("change", function () { if (lastRecord) nextTokens(); });
    $("g-run").addEventListener("click", generate);
    $("fm-run").addEventListener("click", fillMask);
    $("e-run").addEventListener("click", embeddings);
    $("save-html").addEventListener("click", saveHTML);
    $("lens-k").addEventListener("change", function () {
      if (lastRecord) lens(function (fn) { return fn; });
    });
    chatPanel = AttnLLM.chat({
      log: $("c-log"), input: $("c-input"), send: $("c-send"), reset: $("c-reset"),
      system: $("c-system"), temperature: $("c-temperature"), max: $("c-max"), seed: $("c-seed"),
      status: $("c-status"),
    }, api, function () { return current.name; });
    var ctx = {
      model: function () { return current.name; },
      text: function () { return shownText; },
      onAblate: function () {
        if (view && view.render) view.render(); // the head view's ablate buttons
        scores.marks();
      },
    };
    ablation = AttnInterp.ablation({
      panel: $("ablation"), heads: $("ab-heads"), mean: $("ab-mean"), clear: $("ab-clear"),
      kl: $("ab-kl"), table: $("ab-table"), status: $("ab-status"),
    }, api, ctx);
    patching = AttnInterp.patching({
      clean: $("p-clean"), corrupt: $("p-corrupt"), answer: $("p-answer"), wrong: $("p-wrong"),
      run: $("p-run"), status: $("p-status"), summary: $("p-summary"), resid: $("p-resid"),
      heads: $("p-heads"), readout: $("p-readout"),
    }, api, ctx);
    scores = AttnInterp.scores({
      kind: $("hs-kind"), length: $("hs-length"), seed: $("hs-seed"), run: $("hs-run"),
      status: $("hs-status"), table: $("hs-grid"), readout: $("hs-readout"),
    }, api, ctx, ablation);
    $("model").addEventListener("change", function () {
      showModel($("model").value);
      // the sample follows the model until the user edits the text; either way it redraws
      if ($("text").value === sampleText) useSample();
      run();
    });
    api("models").then(function (r) {
      var sel = $("model");
      r.models.forEach(function (m) {
        models[m.name] = m;
        var o = document.createElement("option");
        o.value = m.name;
        o.textContent = m.name;
        if (m.name === r.default) o.selected = true;
        sel.appendChild(o);
      });
      showModel(r.default);
      if (!readHash() || $("text").value === "") useSample();
      document.body.setAttribute("data-ready", "1");
      run(); // the first screen shows the sample's (or the shared URL's) attention at once
    }, function (e) { status("cannot reach the server: " + e.message, true); });
    window.addEventListener("hashchange", function () { if (readHash()) run(); });
  }

  window.attnExplorer = { buildStandalone: buildStandalone };
  init();
})();
