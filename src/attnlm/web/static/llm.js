/* attnlm explorer: the logit-lens grid and the chat panel (language models).
 *
 * AttnLLM.drawLens(table, answer): draws a POST /api/lens answer {"tokens": [T], "layers":
 * [{"layer", "positions": [T][k] of {"token", "id", "prob"}}]} as a table with one row per
 * layer (L + 1 rows, last layer on top, as `attnlm lens --out` draws it) and one column per
 * position; each cell shows the top prediction, coloured by its probability, the top-k in its
 * tooltip.
 *
 * AttnLLM.chat(elements, api): the chat panel's behaviour; the conversation lives in the page
 * and every POST /api/chat carries all of it (the server keeps its KV cache, so only the new
 * turn is prefilled).
 */
(function (global) {
  "use strict";

  function label(t) { return global.AttnViews.label(t); }

  /* white -> dark blue (matplotlib's "Blues" ends), by probability */
  function blue(p) {
    var w = Math.max(0, Math.min(1, p));
    var c = [Math.round(247 - 239 * w), Math.round(251 - 203 * w), Math.round(255 - 148 * w)];
    return "rgb(" + c.join(",") + ")";
  }

  function drawLens(table, answer) {
    table.innerHTML = "";
    var head = document.createElement("thead"), hr = document.createElement("tr");
    hr.appendChild(document.createElement("th"));
    answer.tokens.forEach(function (t, i) {
      var th = document.createElement("th");
      th.textContent = label(t);
      th.title = "position " + i + ": the cells below predict the token after it";
      hr.appendChild(th);
    });
    head.appendChild(hr);
    table.appendChild(head);
    var body = document.createElement("tbody");
    answer.layers.slice().reverse().forEach(function (row) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-layer", row.layer);
      var th = document.createElement("th");
      th.textContent = row.layer;
      tr.appendChild(th);
      row.positions.forEach(function (cands, i) {
        var td = document.createElement("td"), top = cands[0];
        td.className = "lens-cell";
        td.textContent = label(top.token);
        td.style.background = blue(top.prob);
        td.style.color = top.prob > 0.6 ? "#fff" : "#1d2330";
        td.setAttribute("data-prob", top.prob);
        td.title = row.layer + ", after \u201c" + label(answer.tokens[i]) + "\u201d:\n" +
          cands.map(function (c) { return label(c.token) + "  " + c.prob.toFixed(3); }).join("\n");
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    table.appendChild(body);
  }

  /* The chat panel. els: {log, input, send, reset, system, temperature, max, seed, status};
     api(path, body) -> Promise; model() -> the current model's name. */
  function chat(els, api, model) {
    var messages = [], busy = false;

    function bubble(role, text, meta) {
      var d = document.createElement("div");
      d.className = "msg " + role;
      var r = document.createElement("span");
      r.className = "role";
      r.textContent = role;
      d.appendChild(r);
      d.appendChild(document.createTextNode(text));
      if (meta) {
        var m = document.createElement("span");
        m.className = "meta";
        m.textContent = meta;
        d.appendChild(m);
      }
      els.log.appendChild(d);
      els.log.scrollTop = els.log.scrollHeight;
    }

    function status(msg, isError) {
      els.status.textContent = msg || "";
      els.status.className = "status" + (isError ? " error" : "");
    }

    function reset() {
      messages = [];
      els.log.innerHTML = "";
      status("");
    }

    function num(input) {
      var v = input.value.trim();
      return v === "" ? null : Number(v);
    }

    function send() {
      var text = els.input.value;
      if (busy || !text.trim()) return;
      var sys = els.system.value.trim();
      var convo = (sys ? [{ role: "system", content: sys }] : []).concat(messages,
        [{ role: "user", content: text }]);
      var body = {
        model: model(), messages: convo, temperature: num(els.temperature) || 0,
        max_new_tokens: num(els.max) || 200, seed: num(els.seed),
      };
      busy = true;
      els.send.disabled = true;
      bubble("user", text);
      els.input.value = "";
      status("thinking\u2026");
      api("chat", body).then(function (r) {
        messages.push({ role: "user", content: text }, { role: "assistant", content: r.reply });
        var t = r.timings;
        bubble("assistant", r.reply, r.tokens.length + " tokens (" + r.finish + "), prompt " +
          r.prompt_tokens + " tokens of which " + r.reused_tokens + " cached, prefill " +
          t.prefill_s.toFixed(2) + " s, decode " + t.decode_s.toFixed(2) + " s");
        status("");
      }, function (e) {
        els.log.removeChild(els.log.lastChild); // the turn was not taken: give the text back
        els.input.value = text;
        status(e.message, true);
      }).then(function () { busy = false; els.send.disabled = false; });
    }

    els.send.addEventListener("click", send);
    els.reset.addEventListener("click", reset);
    els.input.addEventListener("keydown", function (e) {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
    });
    return { reset: reset, messages: function () { return messages.slice(); } };
  }

  global.AttnLLM = { drawLens: drawLens, chat: chat, blue: blue };
})(window);
