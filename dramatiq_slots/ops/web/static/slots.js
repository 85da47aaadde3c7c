// The operators' page of dramatiq-slots: polls the page's JSON and redraws, without reloading.
//
// No build step, no library. Every text from the server is put in with textContent (through
// el() below, which makes text nodes), never parsed as HTML; the charts are SVG elements made
// one by one (svg() below), never markup. Views, by the address's hash:
// #ledgers?q=...&page=N (the list), #ledger/<queue:name | key:digest> (one ledger),
// #processes (the worker processes). The JSON documents are described in docs/operations.md.
(function () {
  "use strict";

  function meta(name) {
    const node = document.querySelector('meta[name="' + name + '"]');
    return node ? node.getAttribute("content") : "";
  }

  const BASE = meta("slots-base");
  const REFRESH = Math.max(100, Number(meta("slots-refresh")) || 2000);
  const CONTROLS = meta("slots-controls") === "on";

  // -- building the page ---------------------------------------------------------------------

  // el("td", {class: "x", dataset: {token: t}}, "text", child): an element, its texts as text nodes.
  function el(tag, attrs) {
    const node = document.createElement(tag);
    const options = attrs || {};
    Object.keys(options).forEach(function (key) {
      const value = options[key];
      if (value === null || value === undefined || value === false) return;
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.keys(value).forEach(function (k) { node.dataset[k] = String(value[k]); });
      else if (key === "on") Object.keys(value).forEach(function (k) { node.addEventListener(k, value[k]); });
      else node.setAttribute(key, value === true ? "" : String(value));
    });
    for (let i = 2; i < arguments.length; i++) addOne(node, arguments[i]);
    return node;
  }

  // add(node, child, ...): children appended; a string as a text node, an array flattened.
  function add(node) {
    for (let i = 1; i < arguments.length; i++) addOne(node, arguments[i]);
  }

  function addOne(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { addOne(node, c); }); return; }
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }

  // A table of the page: its headings (a text, or [text, what the column counts]), and the body a
  // view redraws (fill() below). Narrow screens show each row as a card, each cell under its heading.
  function table(id, headings, bodyNode) {
    bodyNode.dataset.headings = JSON.stringify(headings.map(function (h) { return Array.isArray(h) ? h[0] : h; }));
    return el(
      "table",
      { class: "list", id: id },
      el("thead", null, el("tr", null, headings.map(function (h) {
        return Array.isArray(h) ? el("th", { title: h[1] }, h[0], el("span", { class: "hint" }, "?")) : el("th", null, h);
      }))),
      bodyNode
    );
  }

  // The body's rows replaced by these, each cell labelled with its column's heading.
  function fill(bodyNode, rows) {
    const headings = JSON.parse(bodyNode.dataset.headings || "[]");
    bodyNode.replaceChildren();
    add(bodyNode, rows);
    Array.from(bodyNode.rows).forEach(function (row) {
      Array.from(row.cells).forEach(function (cell, i) {
        if (cell.colSpan === 1 && headings[i]) cell.dataset.label = headings[i];
      });
    });
  }

  function ledgerLink(short) {
    return el("a", { href: "#ledger/" + encodeURIComponent(short), class: "ledger-link" }, short);
  }

  // A runtime key's label where the workers report one (Slots(key_labels=...)), beside its digest.
  function keyLabel(label) {
    return label === null || label === undefined ? null : el("span", { class: "key-label", title: "the runtime key's label, as its workers report it" }, label);
  }

  // -- texts ---------------------------------------------------------------------------------------

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "-";
    if (seconds < 60) return seconds.toFixed(1) + "s";
    const minutes = Math.floor(seconds / 60);
    if (minutes < 60) return minutes + "m" + String(Math.floor(seconds % 60)).padStart(2, "0") + "s";
    return Math.floor(minutes / 60) + "h" + String(minutes % 60).padStart(2, "0") + "m";
  }

  function when(at) {
    if (at === null || at === undefined) return "-";
    return new Date(at * 1000).toLocaleString();
  }

  // Who set a control, when, why and until when: "by alice@ops at ..., 'db migration', ends ...".
  function provenanceText(p) {
    let text = "by " + orDash(p.by) + " at " + when(p.at);
    if (p.reason) text += ", '" + p.reason + "'";
    text += p.until === null || p.until === undefined ? ", until changed" : ", ends " + when(p.until);
    return text;
  }

  function orDash(value) {
    return value === null || value === undefined ? "-" : String(value);
  }

  // The actions that take a reason, and those that take a duration (as the server does).
  const REASONED = ["pause", "set-capacity", "reset-capacity", "resume", "release"];
  const TIMED = ["pause", "set-capacity"];

  // How a message waits for its slot (a report's "how").
  const HOW = { parked: "parked", held_back: "held back (in no line)" };

  // What each count counts: the headings' and the cells' tooltips.
  const COUNTS = {
    in_use: "Slots held now, of the capacity in force: by running jobs, and by lingering holds a process keeps for its next message",
    line: "Claims in the ledger's line, waiting for a slot: parked (the message in its worker's memory, no thread held), and those of processes no longer reporting",
    held_back: "Messages a worker took from the broker and keeps in its memory in no line yet (its process lines up no more claims on the ledger)",
    parked: "Claims of this process in a ledger's line whose message waits in the worker's memory, holding no thread",
    running: "Slots this process holds: each a message taken by a worker thread (or a lingering hold kept for its next message)",
    owed: "Releases Redis has not confirmed yet, retried every beat",
    depth: "The queue in the broker, as a worker last read it: ready, not taken by any worker yet; taken, by workers and not acked yet (running, waiting for a slot, or prefetched in a worker); delayed, in its delay queue (deferred copies among them)",
    chart: "In use (solid) against the capacity (dashed), and the line's length (dotted), since this page was opened",
  };

  function capacityText(ledger) {
    const inForce = orDash(ledger.capacity);
    if (ledger.override === null) return inForce;
    return inForce + " (override; declared " + orDash(ledger.declared) + ")";
  }

  // -- the operator's session (dramatiq-slots web --controls) -------------------------------------

  // The standalone server signs a tab in at BASE/login?token=..., which sends it on to
  // BASE/#session=S. S is moved at once into this tab's sessionStorage, which no page of another
  // origin reads (another port of this host included), and the address cleared; every request
  // carries it in X-Slots-Session. No cookie carries it: a host's cookies go to all its ports.
  const SESSION = "slots-session";

  function session() {
    try {
      return sessionStorage.getItem(SESSION);
    } catch (error) {
      return null; // storage refused: signed out
    }
  }

  function keepSession(value) {
    try {
      if (value) sessionStorage.setItem(SESSION, value);
      else sessionStorage.removeItem(SESSION);
    } catch (error) {
      // storage refused: the tab stays signed out
    }
  }

  const signingIn = /^#session=([A-Za-z0-9_-]{32,64})$/.exec(location.hash);
  if (signingIn) {
    keepSession(signingIn[1]);
    history.replaceState(null, "", location.pathname + location.search);
  }

  // -- talking to the server -----------------------------------------------------------------------

  function headers(extra) {
    const all = Object.assign({ Accept: "application/json" }, extra || {});
    const key = session();
    if (key) all["X-Slots-Session"] = key;
    return all;
  }

  function answer(response) {
    return response.json().catch(function () { return null; }).then(function (doc) {
      return { ok: response.ok, status: response.status, document: doc || {} };
    });
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: headers() }).then(answer).then(function (reply) {
      if (!reply.ok) throw new Error(reply.document.error || String(reply.status));
      return reply.document;
    });
  }

  // Who this tab is, its CSRF token (of its cookie, its user and its session) and what it may do:
  // asked at start, and again at a sign-out. A session the server no longer knows is dropped.
  let who = null;
  let signedOut = "";

  function askWho() {
    who = getJSON(BASE + "/api/session").then(function (doc) {
      if (session() && CONTROLS && !doc.allowed.length) {
        keepSession(null);
        signedOut = "signed out: the session ended";
        return askWho();
      }
      drawWho(doc);
      return doc;
    });
    return who;
  }

  function drawWho(doc) {
    const box = document.getElementById("who");
    box.replaceChildren();
    if (session()) {
      add(box, "acting as " + doc.user, el("button", { type: "button", id: "sign-out", on: { click: signOut } }, "Sign out"));
    } else {
      add(box, signedOut);
    }
  }

  function signOut() {
    const ended = fetch(BASE + "/logout", { method: "POST", credentials: "same-origin", headers: headers() });
    ended.catch(function () { return null; }).then(function () {
      keepSession(null);
      signedOut = "signed out";
      askWho();
      show();
    });
  }

  function post(action, fields) {
    const body = new URLSearchParams(fields);
    return who
      .then(function (doc) {
        return fetch(BASE + "/api/actions/" + encodeURIComponent(action), {
          method: "POST",
          credentials: "same-origin",
          headers: headers({ "X-Slots-CSRF": doc.csrf, "Content-Type": "application/x-www-form-urlencoded" }),
          body: body.toString(),
        });
      })
      .then(answer)
      .catch(function (error) {
        return { ok: false, status: 0, document: { error: error.message } };
      });
  }

  // -- the refresh loop ------------------------------------------------------------------------------

  let current = null;
  let generation = 0;
  let timer = null;
  let refreshes = 0;

  function setError(text) {
    const box = document.getElementById("error");
    box.hidden = !text;
    box.textContent = text || "";
  }

  function refreshed() {
    refreshes += 1;
    const stamp = document.getElementById("refreshed");
    stamp.dataset.count = String(refreshes);
    stamp.textContent = "updated " + new Date().toLocaleTimeString();
  }

  function tick(mine) {
    getJSON(current.url())
      .then(function (doc) {
        if (mine !== generation) return;
        document.getElementById("server").textContent = doc.server + "  prefix " + doc.prefix;
        current.render(doc);
        setError(null);
        refreshed();
        if (asked) answerWhy(asked);
      })
      .catch(function (error) {
        if (mine === generation) setError(error.message);
      })
      .then(function () {
        if (mine === generation) timer = setTimeout(function () { tick(mine); }, REFRESH);
      });
  }

  function refreshNow() {
    generation += 1;
    clearTimeout(timer);
    tick(generation);
  }

  function route() {
    let hash = location.hash.replace(/^#/, "");
    try {
      hash = decodeURIComponent(hash);
    } catch (error) {
      // a malformed %-escape: read the hash as it is
    }
    if (hash.indexOf("ledger/") === 0) return { view: "ledger", name: hash.slice("ledger/".length) };
    if (hash === "processes") return { view: "processes" };
    const query = new URLSearchParams(location.hash.split("?")[1] || "");
    return { view: "ledgers", q: query.get("q") || "", page: Math.max(1, Number(query.get("page")) || 1) };
  }

  function show() {
    const where = route();
    const view = document.getElementById("view");
    view.replaceChildren();
    document.body.dataset.view = where.view;
    current = VIEWS[where.view](where, view);
    refreshNow();
  }

  // -- the ledger list ---------------------------------------------------------------------------------

  function holderLine(holder) {
    return el(
      "li",
      { class: holder.process_alive ? "holder" : "holder dead", dataset: { token: holder.token } },
      el("span", { class: "where" }, holder.host + " " + orDash(holder.pid) + "/" + orDash(holder.thread)),
      " ",
      el("span", { class: "label" }, holder.label !== null
          ? holder.label
          : holder.lingering
            ? "lingering (kept for this process's next message)"
            : holder.process_alive
              ? "not in its report yet" // reports follow an admission within half a second
              : "message unknown"),
      " ",
      el("span", { class: "age" }, "age " + age(holder.age)),
      " ",
      el("span", { class: "left" }, age(holder.seconds_left) + " left"),
      holder.process_alive ? null : el("span", { class: "badge dead" }, "process not reporting")
    );
  }

  // "3 in line (2 parked), 2 held back; the first sent 12.0s ago".
  function lineText(ledger) {
    let text = ledger.waiting + " in line" + (ledger.parked ? " (" + ledger.parked + " parked)" : "");
    if (ledger.held_back) text += ", " + ledger.held_back + " held back";
    if (ledger.waiting) text += "; the first sent " + age(ledger.oldest_wait) + " ago";
    return text;
  }

  function stateBadges(ledger) {
    return [
      ledger.paused ? el("span", { class: "badge paused" }, "paused") : null,
      ledger.settling ? el("span", { class: "badge settling", title: ledger.settling.text }, "settling") : null,
    ];
  }

  function ledgerRow(ledger) {
    const holders = el("ul", { class: "holders" }, ledger.holders.map(holderLine));
    if (ledger.holders_more) add(holders, el("li", { class: "more" }, "+" + ledger.holders_more + " more"));
    return el(
      "tr",
      { dataset: { ledger: ledger.short }, class: ledger.paused ? "paused" : ledger.settling ? "settling" : null },
      el("td", null, ledgerLink(ledger.short), keyLabel(ledger.key_label)),
      el("td", { class: "capacity" }, capacityText(ledger)),
      el("td", { class: "state" }, stateBadges(ledger)),
      el("td", { class: "in-use num", title: ledger.settling ? ledger.settling.text : COUNTS.in_use }, ledger.in_use + " / " + orDash(ledger.capacity)),
      el("td", { class: "line" }, lineText(ledger)),
      el("td", { class: "trend" }, chart(sampled.get(ledger.short), SMALL)),
      el("td", null, holders)
    );
  }

  function ledgersView(where, view) {
    const state = { q: where.q, page: where.page };
    let pending = null;
    const search = el("input", {
      id: "search",
      type: "search",
      placeholder: "start of a queue name or digest, or part of a key's label",
      value: state.q,
      maxlength: 200,
      on: {
        input: function () {
          clearTimeout(pending);
          pending = setTimeout(function () {
            state.q = search.value;
            state.page = 1;
            remember();
            refreshNow();
          }, 250);
        },
      },
    });
    const previous = el("button", { type: "button", id: "previous", on: { click: function () { go(-1); } } }, "previous");
    const next = el("button", { type: "button", id: "next", on: { click: function () { go(1); } } }, "next");
    const pageText = el("span", { id: "page" });
    const body = el("tbody", { id: "ledgers" });
    let last = 1;

    function remember() {
      history.replaceState(null, "", "#ledgers?" + new URLSearchParams({ q: state.q, page: String(state.page) }));
    }
    function go(step) {
      state.page = Math.min(Math.max(1, state.page + step), last);
      remember();
      refreshNow();
    }

    add(
      view,
      el("h2", null, "Ledgers"),
      el("div", { class: "toolbar" }, el("label", { for: "search" }, "Search "), search, " ", previous, " ", pageText, " ", next),
      table(
        "ledgers-table",
        ["Ledger", "Capacity", "State", ["In use", COUNTS.in_use], ["Waiting", COUNTS.line + ". " + COUNTS.held_back], ["Trend", COUNTS.chart], "Holders"],
        body
      )
    );
    return {
      url: function () {
        return BASE + "/api/ledgers?" + new URLSearchParams({ q: state.q, page: String(state.page) });
      },
      render: function (doc) {
        // A search that reaches the runtime keys is not counted: the page says whether more follow.
        last = doc.more ? doc.page + 1 : doc.page;
        state.page = doc.page;
        pageText.textContent =
          doc.total === null
            ? "page " + doc.page + (doc.more ? " (more follow)" : " (the last)")
            : "page " + doc.page + " of " + doc.pages + " (" + doc.total + " ledgers)";
        previous.disabled = doc.page <= 1;
        next.disabled = !doc.more;
        doc.ledgers.forEach(function (ledger) { record(doc.at, ledger); });
        fill(
          body,
          doc.ledgers.length
            ? doc.ledgers.map(ledgerRow)
            : el("tr", null, el("td", { colspan: 7, class: "empty" }, doc.query ? "no ledger matches" : "no ledger holds anything"))
        );
      },
    };
  }

  // -- one ledger --------------------------------------------------------------------------------------

  // A list of [term, value] pairs ([term, value, what the term counts]: its tooltip).
  function dl(pairs) {
    return el(
      "dl",
      null,
      pairs.map(function (pair) { return [el("dt", { title: pair[2] }, pair[0]), el("dd", null, pair[1])]; })
    );
  }

  function ledgerView(where, view) {
    const name = where.name;
    const summary = el("div", { id: "summary" });
    const control = el("div", { id: "control" });
    const panel = el("div", { id: "controls" });
    const notice = el("p", { id: "notice", role: "status" });
    const holders = el("tbody", { id: "holders" });
    const line = el("tbody", { id: "line" });
    const label = el("p", { id: "key-label" });
    const trend = el("div", { id: "trend" });
    let allowed = null;

    // A control, with the reason and the duration where the action takes them.
    function act(action, fields) {
      const all = Object.assign({ ledger: name }, fields);
      const reason = document.getElementById("reason");
      const duration = document.getElementById("duration");
      if (reason && reason.value && REASONED.indexOf(action) >= 0) all.reason = reason.value;
      if (duration && duration.value && TIMED.indexOf(action) >= 0) all.duration = duration.value;
      notice.textContent = action + "...";
      notice.className = "";
      post(action, all).then(function (answer) {
        notice.textContent = answer.document.message || answer.document.error || String(answer.status);
        notice.className = answer.ok ? "ok" : "refused";
        notice.dataset.status = String(answer.status);
        if (answer.status === 403) askWho(); // a session that ended is dropped, and said so
        refreshNow();
      });
    }

    function buildPanel(controls) {
      panel.replaceChildren();
      if (!controls.enabled) {
        add(panel, el("p", { class: "note" }, "Read-only: the controls are off on this page."));
        return;
      }
      if (!controls.allowed.length) {
        add(panel, el("p", { class: "note" }, "You may not act on this page."));
        return;
      }
      const may = function (action) { return controls.allowed.indexOf(action) >= 0; };
      const timed = controls.records.indexOf("for_ms") >= 0;
      const reason = el("input", { id: "reason", name: "reason", maxlength: 500, placeholder: "why (optional)" });
      const duration = el("input", {
        id: "duration",
        name: "duration",
        type: "number",
        min: 1,
        placeholder: timed ? "seconds (optional)" : "no expiry yet",
        disabled: !timed,
      });
      const capacity = el("input", { id: "capacity", name: "capacity", type: "number", min: 1, placeholder: "N" });
      function button(action, text, extra) {
        if (!may(action)) return null;
        return el("button", {
          type: "button",
          dataset: { action: action },
          on: { click: function () { act(action, extra ? extra() : {}); } },
        }, text);
      }
      add(
        panel,
        el("h3", null, "Controls"),
        el(
          "div",
          { class: "toolbar" },
          button("pause", "Pause"),
          " ",
          button("resume", "Resume"),
          " ",
          may("set-capacity") ? [el("label", { for: "capacity" }, "capacity "), capacity, " "] : null,
          button("set-capacity", "Set capacity", function () { return { capacity: capacity.value }; }),
          " ",
          button("reset-capacity", "Reset capacity")
        ),
        el(
          "div",
          { class: "toolbar" },
          el("label", { for: "reason" }, "reason "),
          reason,
          " ",
          el("label", { for: "duration" }, "for "),
          duration,
          controls.records.length ? null : el("span", { class: "note" }, " (this version records no reason or author)")
        ),
        notice
      );
    }

    function holderRow(holder) {
      const release =
        allowed && allowed.indexOf("release") >= 0 && !holder.process_alive
          ? el("button", {
              type: "button",
              dataset: { action: "release", token: holder.token },
              on: { click: function () { act("release", { token: holder.token }); } },
            }, "Release")
          : null;
      return el(
        "tr",
        { dataset: { token: holder.token }, class: holder.process_alive ? null : "dead" },
        el("td", null, holder.host),
        el("td", { class: "num" }, orDash(holder.pid)),
        el("td", { class: "num" }, orDash(holder.thread)),
        el("td", null, holder.label === null ? "-" : holder.label),
        el("td", { class: "num" }, age(holder.age)),
        el("td", { class: "num" }, age(holder.seconds_left)),
        el("td", { class: "alive num" }, holder.process_alive ? "yes" : "no"),
        el("td", { class: "token" }, holder.token),
        el("td", null, release)
      );
    }

    function lineRow(claim, i) {
      return el(
        "tr",
        { dataset: { token: claim.token } },
        el("td", { class: "num" }, String(i + 1)),
        el("td", { class: "message" }, claim.message_id === null ? "-" : claim.actor + "(" + claim.message_id + ")"),
        el("td", null, claim.how === null ? "-" : HOW[claim.how] || claim.how),
        el("td", null, claim.host),
        el("td", { class: "num" }, "sent " + age(claim.waited) + " ago"),
        el("td", null, claim.reported_by === null ? "not reported" : claim.reported_by),
        el("td", { class: "token" }, claim.token)
      );
    }

    function heldBackRow(wait) {
      return el(
        "tr",
        { class: "held-back" },
        el("td", { class: "num" }, "-"),
        el("td", { class: "message" }, wait.actor + "(" + wait.message_id + ")"),
        el("td", { title: COUNTS.held_back }, HOW.held_back),
        el("td", null, wait.host),
        el("td", { class: "num" }, "waiting " + age(wait.waited)),
        el("td", null, wait.host + ":" + orDash(wait.pid)),
        el("td", null, "-")
      );
    }

    add(
      view,
      el("p", null, el("a", { href: "#ledgers" }, "all ledgers")),
      el("h2", null, name),
      label,
      summary,
      trend,
      control,
      panel,
      el("h3", null, "Holders"),
      table("holders-table", ["Host", "PID", "Thread", "Message", "Age", "Left", "Alive", "Token", ""], holders),
      el("h3", { title: COUNTS.line }, "Line"),
      table("line-table", ["#", "Message", ["Waits", COUNTS.parked + " " + COUNTS.held_back], "Host", "Sent", "Reported by", "Token"], line)
    );

    return {
      url: function () { return BASE + "/api/ledger?" + new URLSearchParams({ name: name }); },
      render: function (doc) {
        const ledger = doc.ledger;
        if (allowed === null) {
          allowed = doc.controls.allowed;
          buildPanel(doc.controls);
        }
        const state = [];
        if (ledger.paused) state.push("paused since " + when(ledger.paused_at));
        if (ledger.settling) state.push(ledger.settling.text + ": nothing new is admitted until then, while running jobs re-assert their holds");
        const pairs = [
          ["capacity", capacityText(ledger)],
          ["in use", String(ledger.in_use), COUNTS.in_use],
          ["waiting", lineText(ledger), COUNTS.line + ". " + COUNTS.held_back],
          ["state", state.length ? state.join("; ") : "admitting"],
        ];
        const depth = ledger.queue_depth;
        if (depth) {
          pairs.push([
            "queue in the broker",
            depth.ready + " ready (not taken yet), " + depth.taken + " taken by workers, " + depth.delayed + " delayed",
            COUNTS.depth,
          ]);
        }
        summary.replaceChildren(dl(pairs));
        summary.dataset.paused = ledger.paused ? "yes" : "no";
        summary.dataset.settling = ledger.settling ? "yes" : "no";
        label.replaceChildren();
        if (ledger.key_label !== null) add(label, "key ", keyLabel(ledger.key_label));
        record(doc.at, ledger);
        trend.replaceChildren(chart(sampled.get(ledger.short), LARGE), legend(sampled.get(ledger.short)));
        const controlled = [];
        Object.keys(doc.control).forEach(function (key) {
          const value = doc.control[key];
          if (value === null || key === "paused") return;
          if (typeof value === "object") {
            controlled.push([key.replace(/_provenance$/, "").replace(/_/g, " ") + " set", provenanceText(value)]);
            return;
          }
          controlled.push([key.replace(/_/g, " "), /(_at|until)$/.test(key) ? when(value) : String(value)]);
        });
        control.replaceChildren(controlled.length ? el("div", null, el("h3", null, "Control"), dl(controlled)) : "");
        fill(
          holders,
          ledger.holders.length ? ledger.holders.map(holderRow) : el("tr", null, el("td", { colspan: 9, class: "empty" }, "no holds"))
        );
        const rows = doc.line.map(lineRow);
        if (ledger.waiting > doc.line.length) {
          rows.push(el("tr", null, el("td", { colspan: 7, class: "more" }, "+" + (ledger.waiting - doc.line.length) + " more in line")));
        }
        doc.held_back.forEach(function (wait) { rows.push(heldBackRow(wait)); });
        fill(line, rows.length ? rows : el("tr", null, el("td", { colspan: 7, class: "empty" }, "nobody in line")));
      },
    };
  }

  // -- the processes ---------------------------------------------------------------------------------

  // A ledger a process names, by its short name, with its runtime key's label where reported.
  function namedLedger(short, labels) {
    return [ledgerLink(short), keyLabel(labels[short])];
  }

  function countLine(count, text, title) {
    return el("li", { title: title, class: count ? null : "none" }, count + " " + text);
  }

  function processRow(p) {
    const holds = el(
      "ul",
      { class: "items" },
      p.holds.map(function (h) {
        return el(
          "li",
          { dataset: { token: h.token } },
          h.label + " ",
          el("span", { class: "age" }, "age " + age(h.age)),
          " on ",
          Object.keys(h.ledgers).map(function (short) { return [namedLedger(short, p.key_labels), " "]; })
        );
      })
    );
    if (!p.holds.length) add(holds, el("li", { class: "none" }, "none"));
    if (p.lingering) add(holds, el("li", { class: "note" }, p.lingering + " lingering (kept for its next message)"));
    if (p.owed) add(holds, el("li", { class: "note", title: COUNTS.owed }, p.owed + " release(s) owed"));
    const waiting = el(
      "ul",
      { class: "items counts" },
      countLine(p.parked, "parked", COUNTS.parked),
      countLine(p.held_back, "held back", COUNTS.held_back)
    );
    const waits = el(
      "ul",
      { class: "items" },
      p.waits.slice(0, 5).map(function (w) {
        return el(
          "li",
          null,
          w.actor + "(" + w.message_id + ") ",
          el("span", { class: "age" }, (HOW[w.how] || w.how) + " " + age(w.waited)),
          " for ",
          namedLedger(w.ledger, p.key_labels)
        );
      })
    );
    const more = p.waits.length - 5 + p.waits_left_out;
    if (more > 0) add(waits, el("li", { class: "more" }, "+" + more + " more"));
    const declares = Object.keys(p.capacities).map(function (short) {
      return el("div", null, ledgerLink(short), " " + p.capacities[short]);
    });
    return el(
      "tr",
      { dataset: { process: p.process } },
      el(
        "td",
        { class: "process" },
        el("div", { class: "where" }, p.host + " pid " + orDash(p.pid)),
        el("div", { class: "note" }, "reported " + age(p.reported_ago) + " ago"),
        el("div", { class: "note" }, "hold_ttl " + p.hold_ttl + " ms, beat " + p.beat_interval + " ms, " + p.on_lost_hold)
      ),
      el("td", { class: "running" }, holds),
      el("td", { class: "waiting" }, waiting, waits),
      el("td", { class: "recent" }, recentList(p.recent)),
      el("td", { class: "declares" }, declares.length ? declares : "-")
    );
  }

  function processesView(where, view) {
    const body = el("tbody", { id: "processes" });
    add(
      view,
      el("h2", null, "Worker processes"),
      table(
        "processes-table",
        ["Process", ["Running", COUNTS.running], ["Waiting for a slot", COUNTS.parked + ". " + COUNTS.held_back], "Recent", "Declares"],
        body
      )
    );
    return {
      url: function () { return BASE + "/api/processes"; },
      render: function (doc) {
        fill(
          body,
          doc.processes.length
            ? doc.processes.map(processRow)
            : el("tr", null, el("td", { colspan: 5, class: "empty" }, "no live worker process reports"))
        );
      },
    };
  }

  // The newest admissions, deferrals and drops a process reports (newest first, 3 of each kind).
  function recentList(recent) {
    const items = [];
    ["admitted", "deferred", "dropped"].forEach(function (kind) {
      (recent[kind] || []).slice(0, 3).forEach(function (e) {
        let text = kind + " " + e.actor + "(" + e.message_id + ") " + age(e.ago) + " ago";
        if (e.ledger) text += " on " + e.ledger;
        if (e.due_in !== null) text += ", due in " + age(Math.max(0, e.due_in));
        items.push(el("li", { dataset: { kind: kind } }, text));
      });
    });
    return items.length ? el("ul", { class: "items" }, items) : "-";
  }

  // -- the charts: in use, capacity and line, since the page was opened -----------------------------

  // Samples per ledger (by short name), from the documents the page polls: at most MAX_SAMPLES
  // each (an hour at the default refresh), of at most MAX_CHARTED ledgers (the oldest dropped).
  const MAX_SAMPLES = 1800;
  const MAX_CHARTED = 500;
  const sampled = new Map();

  function record(at, ledger) {
    let samples = sampled.get(ledger.short);
    if (!samples) {
      if (sampled.size >= MAX_CHARTED) sampled.delete(sampled.keys().next().value);
      samples = [];
      sampled.set(ledger.short, samples);
    }
    const last = samples[samples.length - 1];
    if (last && last.at >= at) return; // the same reading, drawn twice
    samples.push({ at: at, used: ledger.in_use, capacity: ledger.capacity, line: ledger.waiting });
    if (samples.length > MAX_SAMPLES) samples.shift();
  }

  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (key) { node.setAttribute(key, String(attrs[key])); });
    for (let i = 2; i < arguments.length; i++) {
      const child = arguments[i];
      if (child !== null && child !== undefined) node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  const SMALL = { width: 120, height: 28, axis: false };
  const LARGE = { width: 600, height: 120, axis: true };

  // A step line of one series of samples (null values: not drawn), in a chart of this size.
  function steps(samples, value, x, y) {
    const points = [];
    let previous = null;
    samples.forEach(function (sample) {
      const v = value(sample);
      if (v === null || v === undefined) { previous = null; return; }
      if (previous !== null) points.push(x(sample.at) + "," + y(previous));
      points.push(x(sample.at) + "," + y(v));
      previous = v;
    });
    return points.join(" ");
  }

  function chart(samples, size) {
    const all = samples || [];
    const last = all[all.length - 1];
    const top = Math.max(1, ...all.map(function (s) { return Math.max(s.used, s.line, s.capacity || 0); }));
    const start = all.length ? all[0].at : 0;
    const span = Math.max(1, last ? last.at - start : 1);
    const pad = size.axis ? 14 : 2;
    const x = function (at) { return (pad + ((at - start) / span) * (size.width - 2 * pad)).toFixed(1); };
    const y = function (v) { return (size.height - 2 - (v / top) * (size.height - 4 - (size.axis ? 10 : 0))).toFixed(1); };
    const summary = last
      ? "in use " + last.used + " of " + orDash(last.capacity) + ", " + last.line + " in line; over the last " + age(span) + " (since this page was opened)"
      : "no reading yet";
    const node = svg(
      "svg",
      {
        class: size.axis ? "chart large" : "chart",
        viewBox: "0 0 " + size.width + " " + size.height,
        preserveAspectRatio: "none",
        role: "img",
        "aria-label": summary,
      },
      svg("title", null, summary),
      svg("line", { class: "axis", x1: pad, y1: size.height - 2, x2: size.width - pad, y2: size.height - 2 })
    );
    if (size.axis) node.appendChild(svg("text", { class: "axis-label", x: 1, y: 10 }, String(top)));
    [["capacity", function (s) { return s.capacity; }], ["used", function (s) { return s.used; }], ["line", function (s) { return s.line; }]].forEach(
      function (series) {
        const points = steps(all, series[1], x, y);
        if (points) node.appendChild(svg("polyline", { class: series[0], points: points, "vector-effect": "non-scaling-stroke" }));
      }
    );
    node.dataset.samples = String(all.length);
    return node;
  }

  function legend(samples) {
    const last = samples && samples[samples.length - 1];
    return el(
      "p",
      { class: "legend" },
      el("span", { class: "swatch used" }), "in use " + (last ? last.used : "-") + " ",
      el("span", { class: "swatch capacity" }), "capacity " + (last ? orDash(last.capacity) : "-") + " ",
      el("span", { class: "swatch line" }), "in line " + (last ? last.line : "-"),
      el("span", { class: "note" }, " since this page was opened")
    );
  }

  // -- why is a message waiting ---------------------------------------------------------------------

  function plain(value) {
    if (value === null || value === undefined) return "-";
    if (Array.isArray(value)) return el("ol", null, value.map(function (v) { return el("li", null, plain(v)); }));
    if (typeof value === "object") {
      return dl(Object.keys(value).map(function (k) { return [k.replace(/_/g, " "), plain(value[k])]; }));
    }
    return String(value);
  }

  // The message asked about: its answer is asked again with every refresh, so it stays current
  // (a message that starts running, or whose process reports it since, is told at once).
  let asked = null;
  let askings = 0;

  function answerWhy(id) {
    const box = document.getElementById("why-answer");
    const mine = ++askings;
    getJSON(BASE + "/api/why?" + new URLSearchParams({ message_id: id }))
      .then(function (doc) {
        if (mine !== askings || id !== asked) return; // a newer question, or a newer answer asked
        box.replaceChildren(el("h3", null, "Why " + doc.message_id), plain(doc.answer));
        box.dataset.answered = "yes";
      })
      .catch(function (error) {
        if (mine === askings) box.replaceChildren(el("p", { class: "refused" }, error.message));
      });
  }

  function ask(event) {
    event.preventDefault();
    const box = document.getElementById("why-answer");
    const id = document.getElementById("why-id").value.trim();
    asked = id || null;
    if (!id) return;
    box.hidden = false;
    box.replaceChildren(el("p", null, "asking..."));
    answerWhy(id);
  }

  const VIEWS = { ledgers: ledgersView, ledger: ledgerView, processes: processesView };

  document.addEventListener("DOMContentLoaded", function () {
    document.body.dataset.controls = CONTROLS ? "on" : "off";
    document.getElementById("why-form").addEventListener("submit", ask);
    window.addEventListener("hashchange", show);
    askWho().catch(function (error) { setError(error.message); });
    show();
  });
})();
