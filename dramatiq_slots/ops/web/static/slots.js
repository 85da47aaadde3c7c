// The operators' page of dramatiq-slots: polls the page's JSON and redraws, without reloading.
//
// No build step, no library. Every text from the server is put in with textContent (through
// el() below, which makes text nodes), never parsed as HTML. Views, by the address's hash:
// #ledgers?q=...&page=N (the list), #ledger/<queue:name | key:digest> (one ledger),
// #processes (the worker processes). The JSON documents are described in docs/operations.md.
(function () {
  "use strict";

  function meta(name) {
    const node = document.querySelector('meta[name="' + name + '"]');
    return node ? node.getAttribute("content") : "";
  }

  const BASE = meta("slots-base");
  const CSRF = meta("slots-csrf");
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

  // A table of the page: its headings, and the body a view redraws.
  function table(id, headings, bodyNode) {
    return el(
      "table",
      { class: "list", id: id },
      el("thead", null, el("tr", null, headings.map(function (h) { return el("th", null, h); }))),
      bodyNode
    );
  }

  function ledgerLink(short) {
    return el("a", { href: "#ledger/" + encodeURIComponent(short), class: "ledger-link" }, short);
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

  function capacityText(ledger) {
    const inForce = orDash(ledger.capacity);
    if (ledger.override === null) return inForce;
    return inForce + " (override; declared " + orDash(ledger.declared) + ")";
  }

  // -- talking to the server -----------------------------------------------------------------------

  function failure(response, doc) {
    const text = doc && doc.error ? doc.error : response.status + " " + response.statusText;
    return new Error(text);
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(
      function (response) {
        return response.json().catch(function () { return null; }).then(function (doc) {
          if (!response.ok) throw failure(response, doc);
          return doc;
        });
      }
    );
  }

  function post(action, fields) {
    const body = new URLSearchParams(fields);
    return fetch(BASE + "/api/actions/" + encodeURIComponent(action), {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-Slots-CSRF": CSRF, "Content-Type": "application/x-www-form-urlencoded" },
      body: body.toString(),
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (doc) {
        return { ok: response.ok, status: response.status, document: doc || {} };
      });
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

  function lineText(ledger) {
    if (!ledger.waiting) return "0";
    return ledger.waiting + " (oldest sent " + age(ledger.oldest_wait) + " ago)";
  }

  function ledgerRow(ledger) {
    const holders = el("ul", { class: "holders" }, ledger.holders.map(holderLine));
    if (ledger.holders_more) add(holders, el("li", { class: "more" }, "+" + ledger.holders_more + " more"));
    return el(
      "tr",
      { dataset: { ledger: ledger.short }, class: ledger.paused ? "paused" : null },
      el("td", null, ledgerLink(ledger.short)),
      el("td", { class: "capacity" }, capacityText(ledger)),
      el("td", { class: "state" }, ledger.paused ? el("span", { class: "badge paused" }, "paused") : ""),
      el("td", { class: "in-use" }, ledger.in_use + " / " + orDash(ledger.capacity)),
      el("td", { class: "line" }, lineText(ledger)),
      el("td", null, holders)
    );
  }

  function ledgersView(where, view) {
    const state = { q: where.q, page: where.page };
    let pending = null;
    const search = el("input", {
      id: "search",
      type: "search",
      placeholder: "start of a queue name or digest (queue:… or key:… for one kind)",
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
      table("ledgers-table", ["Ledger", "Capacity", "", "In use", "Line", "Holders"], body)
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
        body.replaceChildren();
        if (!doc.ledgers.length) {
          add(body, el("tr", null, el("td", { colspan: 6, class: "empty" }, doc.query ? "no ledger matches" : "no ledger holds anything")));
        }
        add(body, doc.ledgers.map(ledgerRow));
      },
    };
  }

  // -- one ledger --------------------------------------------------------------------------------------

  function dl(pairs) {
    return el(
      "dl",
      null,
      pairs.map(function (pair) { return [el("dt", null, pair[0]), el("dd", null, pair[1])]; })
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
    let allowed = null;

    function act(action, fields) {
      notice.textContent = action + "...";
      notice.className = "";
      post(action, Object.assign({ ledger: name }, fields)).then(function (answer) {
        notice.textContent = answer.document.message || answer.document.error || String(answer.status);
        notice.className = answer.ok ? "ok" : "refused";
        notice.dataset.status = String(answer.status);
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
      function fields(extra) {
        const out = Object.assign({ reason: reason.value }, extra || {});
        if (duration.value) out.duration = duration.value;
        return out;
      }
      function button(action, text, extra) {
        if (!may(action)) return null;
        return el("button", {
          type: "button",
          dataset: { action: action },
          on: { click: function () { act(action, fields(extra ? extra() : null)); } },
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
        el("td", null, orDash(holder.pid)),
        el("td", null, orDash(holder.thread)),
        el("td", null, holder.label === null ? "-" : holder.label),
        el("td", null, age(holder.age)),
        el("td", null, age(holder.seconds_left)),
        el("td", { class: "alive" }, holder.process_alive ? "yes" : "no"),
        el("td", { class: "token" }, holder.token),
        el("td", null, release)
      );
    }

    function lineRow(claim, i) {
      return el(
        "tr",
        { dataset: { token: claim.token } },
        el("td", null, String(i + 1)),
        el("td", null, claim.host),
        el("td", null, "sent " + age(claim.waited) + " ago"),
        el("td", null, claim.reported_by === null ? "-" : claim.reported_by),
        el("td", { class: "token" }, claim.token)
      );
    }

    add(
      view,
      el("p", null, el("a", { href: "#ledgers" }, "all ledgers")),
      el("h2", null, name),
      summary,
      control,
      panel,
      el("h3", null, "Holders"),
      table("holders-table", ["Host", "PID", "Thread", "Message", "Age", "Left", "Alive", "Token", ""], holders),
      el("h3", null, "Line"),
      table("line-table", ["#", "Host", "Waiting", "Reported by", "Token"], line)
    );

    return {
      url: function () { return BASE + "/api/ledger?" + new URLSearchParams({ name: name }); },
      render: function (doc) {
        const ledger = doc.ledger;
        if (allowed === null) {
          allowed = doc.controls.allowed;
          buildPanel(doc.controls);
        }
        summary.replaceChildren(
          dl([
            ["capacity", capacityText(ledger)],
            ["in use", String(ledger.in_use)],
            ["line", lineText(ledger)],
            ["state", ledger.paused ? "paused since " + when(ledger.paused_at) : "admitting"],
          ])
        );
        summary.dataset.paused = ledger.paused ? "yes" : "no";
        const pairs = [];
        Object.keys(doc.control).forEach(function (key) {
          const value = doc.control[key];
          if (value === null || key === "paused") return;
          if (typeof value === "object") {
            pairs.push([key.replace(/_provenance$/, "").replace(/_/g, " ") + " set", provenanceText(value)]);
            return;
          }
          pairs.push([key.replace(/_/g, " "), /(_at|until)$/.test(key) ? when(value) : String(value)]);
        });
        control.replaceChildren(pairs.length ? el("div", null, el("h3", null, "Control"), dl(pairs)) : "");
        holders.replaceChildren();
        if (!ledger.holders.length) add(holders, el("tr", null, el("td", { colspan: 9, class: "empty" }, "no holds")));
        add(holders, ledger.holders.map(holderRow));
        line.replaceChildren();
        if (!doc.line.length) add(line, el("tr", null, el("td", { colspan: 5, class: "empty" }, "nobody in line")));
        add(line, doc.line.map(lineRow));
        if (ledger.waiting > doc.line.length) {
          add(line, el("tr", null, el("td", { colspan: 5, class: "more" }, "+" + (ledger.waiting - doc.line.length) + " more")));
        }
      },
    };
  }

  // -- the processes ---------------------------------------------------------------------------------

  function processesView(where, view) {
    const body = el("tbody", { id: "processes" });
    add(
      view,
      el("h2", null, "Worker processes"),
      table(
        "processes-table",
        ["Process", "Reported", "Holds", "Waiting", "Parked", "Held back", "Owed", "Recent", "Declares", "Settings"],
        body
      )
    );
    return {
      url: function () { return BASE + "/api/processes"; },
      render: function (doc) {
        body.replaceChildren();
        if (!doc.processes.length) add(body, el("tr", null, el("td", { colspan: 9, class: "empty" }, "no live worker process reports")));
        add(
          body,
          doc.processes.map(function (p) {
            const holds = el(
              "ul",
              { class: "holders" },
              p.holds.map(function (h) {
                return el(
                  "li",
                  { dataset: { token: h.token } },
                  h.label + " ",
                  el("span", { class: "age" }, "age " + age(h.age)),
                  " ",
                  Object.keys(h.ledgers).map(function (short) { return [ledgerLink(short), " "]; })
                );
              })
            );
            const declares = Object.keys(p.capacities).map(function (short) {
              return el("div", null, ledgerLink(short), " " + p.capacities[short]);
            });
            return el(
              "tr",
              { dataset: { process: p.process } },
              el("td", null, p.host + " pid " + orDash(p.pid)),
              el("td", null, age(p.reported_ago) + " ago"),
              el("td", null, holds),
              el("td", null, String(p.waiting)),
              el("td", null, String(p.parked)),
              el("td", null, String(p.held_back)),
              el("td", null, String(p.owed)),
              el("td", { class: "recent" }, recentList(p.recent)),
              el("td", null, declares),
              el("td", null, "hold_ttl " + p.hold_ttl + " ms, beat " + p.beat_interval + " ms, " + p.on_lost_hold)
            );
          })
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
    return items.length ? el("ul", { class: "holders" }, items) : "-";
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
    show();
  });
})();
