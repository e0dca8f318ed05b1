// The status page of spool: draws /api/status (or /api/jobs/ID) and keeps it fresh.
//
// Rules this file keeps:
// * Every value goes on screen as text (textContent, text nodes): nothing from
//   the spool is ever parsed as HTML. Links and image sources are built only
//   from values that match a job ID or a sha256.
// * One request at a time: the next fetch is scheduled when the last one has
//   finished, every `refresh_seconds`; failures back off exponentially (with
//   jitter, at most 60 s); a hidden tab does not fetch at all. The page never
//   reloads itself.
"use strict";

(() => {
  const STATES = ["incoming", "waiting", "pending", "held", "running", "complete", "failed", "rejected"];
  const JOB_ID = /^[a-z0-9][a-z0-9._-]{0,95}@[1-9][0-9]{0,8}$/;
  const THUMB = /^thumbs\/[0-9a-f]{64}\.jpg$/;
  const MAX_DELAY = 60000;

  const $ = (id) => document.getElementById(id);

  // An element with attributes and children; strings become text nodes.
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else e.setAttribute(k, String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const jobLink = (id) => (JOB_ID.test(id) ? h("a", { href: "/jobs/" + encodeURIComponent(id) }, id) : h("span", {}, id));
  const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");
  const clock = () => new Date().toLocaleTimeString();
  const empty = (text) => h("p", { class: "empty" }, text);

  function ago(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.max(0, seconds);
    if (s < 60) return Math.round(s) + "s";
    if (s < 3600) return Math.round(s / 60) + "m";
    if (s < 86400) return (s / 3600).toFixed(1) + "h";
    return (s / 86400).toFixed(1) + "d";
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return i === 0 ? v + " B" : v.toFixed(1) + " " + units[i];
  }

  function table(headers, rows) {
    return h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, c))))));
  }

  function progressCells(p, step) {
    if (!p) return [h("span", { class: "dim" }, step || "starting"), "", "", ""];
    const pct = p.percent;
    return [
      [pct === null ? h("progress", { max: 100 }) : h("progress", { max: 100, value: pct }), " ",
        pct === null ? "?" : pct.toFixed(1) + "%"],
      p.fps ? Math.round(p.fps) + " fps" : "– fps",
      p.speed ? p.speed.toFixed(2) + "x" : "–",
      p.eta_seconds === null || p.eta_seconds === undefined ? "ETA ?" : "ETA " + ago(p.eta_seconds),
    ];
  }

  function thumb(path, label, cls) {
    if (path && THUMB.test(path)) return h("img", { src: "/" + path, alt: "poster frame of " + label, class: cls || null });
    return h("div", { class: "noimg" }, "no preview");
  }

  // -- the queue ---------------------------------------------------------------------------

  function drawStatus(d) {
    document.title = `spool: ${d.counts.running} running, ${d.counts.pending} pending, ${d.counts.failed} failed`;
    $("spool-path").textContent = d.spool;
    for (const s of STATES) {
      $("count-" + s).textContent = (d.counts[s] ?? 0).toLocaleString();
      const age = $("age-" + s);
      if (age) {
        const a = d.oldest_age ? d.oldest_age[s] : null;
        age.textContent = a === null || a === undefined ? "" : (s === "running" ? "longest " : "oldest ") + ago(a);
      }
    }

    // Attempts per state of the running generation jobs (the key is there only while some run).
    const gens = d.generations ? Object.entries(d.generations) : [];
    $("running").replaceChildren(
      gens.length ? h("p", { class: "dim", id: "generations" }, "generations: " + gens.map(([s, n]) => `${s} ${n}`).join(", ")) : "",
      d.running.length
        ? table(["job", "worker", "progress", "fps", "speed", "ETA", "for"],
          d.running.map((r) => [jobLink(r.job_id), r.worker, ...progressCells(r.progress, r.step), ago(r.seconds)]))
        : empty("Nothing is running."));

    const more = [];
    for (const s of ["failed", "rejected"]) {
      const hidden = d.counts[s] - d[s].length;
      if (hidden > 0) more.push(`${hidden.toLocaleString()} more ${s} (spool ls ${s})`);
    }
    $("attention").replaceChildren(d.attention.length
      ? h("ul", { class: "attention" }, d.attention.map((a) => h("li", { class: a.kind },
          h("span", { class: "badge " + a.kind }, a.kind), " ",
          a.kind === "failed" ? jobLink(a.subject) : h("strong", {}, a.subject), ": ", a.problem,
          h("span", { class: "next" }, h("strong", {}, "next: "), a.next_action))),
        more.length ? h("p", { class: "dim" }, "and " + more.join(", ")) : null)
      : h("p", { class: "empty ok" }, "Nothing needs attention."));

    $("recent").replaceChildren(...(d.recent.length
      ? d.recent.map((r) => h("div", { class: "card" }, thumb(r.thumbnail, r.job_id),
          h("div", { class: "body" }, jobLink(r.job_id), " ", h("span", { class: "dim" }, bytes(r.size)),
            h("div", { class: "dim" }, when(r.published_at)),
            h("code", { title: "sha256 of " + r.file }, r.sha256))))
      : [empty("No outputs yet.")]));

    $("workers").replaceChildren(d.workers.length
      ? table(["worker", "health", "slots", "disk", "heartbeat", "why"],
        d.workers.map((w) => [w.worker, h("span", { class: "badge " + w.health }, w.health),
          `${w.active}/${w.max_active}`,
          bytes(w.disk_used) + (w.disk_limit ? " of " + bytes(w.disk_limit) : ""),
          ago(w.heartbeat_age) + " ago", h("span", { class: "dim" }, w.reason)]))
      : empty("No worker has started on this spool yet."));
  }

  // -- the library (SPEC 9): a search box and the current versions it finds ----------------

  const SHA = /^[0-9a-f]{64}$/;

  function terms(text) {
    // Whitespace separates terms; double quotes keep spaces inside one (campaign="Summer sale").
    return (text.match(/(?:[^\s"]+|"[^"]*")+/g) || []).map((t) => t.replace(/"/g, ""));
  }

  function drawLibrary(d) {
    const partial = Object.entries(d.partial || {}).map(([f, n]) => `${n} could not be judged on ${f}`);
    $("lib-note").textContent = `${d.results.length} result(s)` + (partial.length ? "; partial: " + partial.join(", ") : "");
    $("lib-grid").replaceChildren(...(d.results.length
      ? d.results.map((r) => h("div", { class: "card asset" }, thumb(r.thumbnail, r.job),
          h("div", { class: "body" }, jobLink(r.job), " ",
            h("span", { class: "dim" }, [r.resolution, r.duration === null ? null : r.duration.toFixed(1) + " s"].filter(Boolean).join(", ")),
            h("ul", { class: "tags" }, Object.entries(r.tags).map(([k, v]) => h("li", {}, k + " = " + v))),
            SHA.test(r.sha256) ? h("a", { href: "/download/" + r.sha256, download: r.file, class: "download" }, "download") : null)))
      : [empty("No asset matches.")]));
  }

  async function searchLibrary() {
    const q = terms($("lib-q").value).map((t) => "t=" + encodeURIComponent(t)).join("&");
    try {
      const r = await fetch("/api/library" + (q ? "?" + q : ""), { cache: "no-store", headers: { Accept: "application/json" } });
      const d = await r.json();
      if (!r.ok) {
        $("lib-note").textContent = d.error || "HTTP " + r.status;
        $("lib-grid").replaceChildren();
      } else {
        drawLibrary(d);
      }
      document.body.dataset.librarySearches = String(Number(document.body.dataset.librarySearches || 0) + 1);
    } catch (e) {
      $("lib-note").textContent = "cannot reach the spool server (" + e.message + ")";
    }
  }

  // -- one job -------------------------------------------------------------------------------

  function facts(pairs) {
    return h("dl", { class: "facts" }, pairs.filter(([, v]) => v !== null && v !== undefined && v !== "")
      .map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  // A fan-out's parent: its variants as a grid, a row per value of the first axis, each a
  // poster frame (once published) with its state, linking to the variant's own page.
  function drawCampaign(d) {
    const id = `${d.name}@${d.revision}`;
    document.title = `spool: ${id} (${d.variants.length} variants)`;
    $("job-id").textContent = id;
    const badge = $("job-state");
    badge.textContent = Object.entries(d.counts).map(([s, n]) => `${n} ${s}`).join(", ");
    badge.className = "badge " + (Object.keys(d.counts).length === 1 ? Object.keys(d.counts)[0] : "");
    const first = d.axes[0].axis;
    const rows = d.axes[0].values.map((value) => {
      const cells = d.variants.filter((v) => v.values[first] === value).map((v) =>
        h("div", { class: "card variant " + v.state },
          thumb(v.thumbnail, v.job),
          h("div", { class: "body" },
            h("span", { class: "badge " + v.state }, v.state), " ",
            Object.entries(v.values).map(([k, x]) => `${k}=${x}`).join(" "),
            v.approvals ? ` (${v.approvals} approved)` : "",
            h("code", {}, jobLink(v.job)))));
      return [h("h2", {}, `${first} ${value}`), h("div", { class: "cards campaign" }, cells)];
    });
    $("job-body").replaceChildren(...rows.flat());
  }

  function drawJob(d) {
    if (d.variants) return drawCampaign(d);
    const j = d.job;
    document.title = `spool: ${j.job_id} ${d.state}`;
    $("job-id").textContent = j.job_id;
    const badge = $("job-state");
    badge.textContent = d.state + (d.worker ? " on " + d.worker : "");
    badge.className = "badge " + d.state;
    const parts = [];

    parts.push(facts([
      ["submitted", `${when(j.submitted_at)} by ${j.submitted_by}`],
      ["priority", String(j.priority)],
      ["operation", j.operation],
      ["supersedes", j.supersedes ? jobLink(j.supersedes) : null],
      ["variant of", d.parent ? [jobLink(d.parent), " " + Object.entries(d.variant || {}).map(([k, v]) => `${k}=${v}`).join(" ")] : null],
      ["output", j.output.file],
      ["recipe", h("code", {}, j.recipe_hash)],
      ["sources", j.sources.length ? j.sources.map((s) => h("div", {}, s.role + ": ", h("code", {}, s.path))) : null],
      ["tags", Object.entries(j.tags).map(([k, v]) => h("div", {}, k + " = " + v))],
    ]));

    if (d.failure) {
      const f = d.failure;
      parts.push(h("h2", {}, "Failure"), h("div", { class: "failure" },
        h("p", {}, h("strong", {}, `${f.stage}: ${f.property}`), ": " + f.message),
        f.expected !== null || f.actual !== null
          ? h("p", {}, "expected ", h("code", {}, JSON.stringify(f.expected)), ", got ", h("code", {}, JSON.stringify(f.actual)))
          : null,
        f.log_excerpt.length ? h("pre", {}, f.log_excerpt.join("\n")) : null,
        h("p", {}, h("strong", {}, "next: "), f.next_action)));
    }

    if (d.manifest) {
      const m = d.manifest;
      const failed = m.validation.checks.filter((c) => !c.ok).map((c) => c.name);
      parts.push(h("h2", {}, "Output"), thumb(d.thumbnail, j.job_id, "poster"), facts([
        ["sha256", h("code", {}, m.output.sha256)],
        ["store", h("code", {}, m.output.store_path)],
        ["size", `${bytes(m.output.size)} (${m.output.size} bytes)`],
        ["published", `${when(m.published_at)} by ${m.worker}, attempt ${m.attempt}`],
        ["times", `render ${m.render_seconds.toFixed(1)} s, validation ${m.validate_seconds.toFixed(1)} s`],
        ["validation", failed.length ? "failed: " + failed.join(", ")
          : `${m.validation.checks.length} checks passed (${m.validation.decode_check} decode)`],
      ]));
    }

    parts.push(h("h2", {}, "Attempts"), d.attempts.length
      ? table(["#", "worker", "claimed", "outcome", "progress"], d.attempts.map((a) => [
          String(a.n), a.worker || "?", when(a.claimed_at), a.outcome,
          a.progress && a.outcome === "running or abandoned" ? progressCells(a.progress)[0] : ""]))
      : empty("No attempt yet."));

    parts.push(h("h2", {}, "Timeline"), d.timeline.length
      ? table(["when", "from", "to", "#", "worker", "why"], d.timeline.map((e) => [
          when(e.ts), e.from || "–", h("span", { class: "badge " + e.to }, e.to),
          e.attempt ?? "", e.worker || "", e.reason || ""]))
      : empty("No journal lines for this job."));

    parts.push(h("h2", {}, "Approvals"), d.approvals.length
      ? h("ul", {}, d.approvals.map((a) => h("li", {}, Object.entries(a).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(", "))))
      : empty("None."));

    $("job-body").replaceChildren(...parts);
  }

  // -- fetching ---------------------------------------------------------------------------------

  const m = location.pathname.match(/^\/jobs\/([^/]+)$/);
  const jobId = m ? decodeURIComponent(m[1]) : null;
  const api = jobId ? "/api/jobs/" + encodeURIComponent(jobId) : "/api/status";
  $(jobId ? "job-view" : "status-view").hidden = false;

  let refresh = 5000;
  let failures = 0;
  let timer = null;
  let inflight = false;
  let updates = 0;

  function setConn(ok, text) {
    const c = $("conn");
    c.textContent = text;
    c.className = ok ? "conn" : "conn error";
  }

  async function poll() {
    timer = null;
    if (document.hidden) return; // resumed by visibilitychange
    inflight = true;
    let delay = refresh;
    try {
      const r = await fetch(api, { cache: "no-store", headers: { Accept: "application/json" } });
      if (r.status === 404 && jobId) {
        $("job-id").textContent = jobId;
        $("job-body").replaceChildren(empty("There is no such job in this spool (yet)."));
      } else if (!r.ok) {
        throw new Error("HTTP " + r.status);
      } else {
        const d = await r.json();
        if (d.refresh_seconds > 0) refresh = d.refresh_seconds * 1000;
        (jobId ? drawJob : drawStatus)(d);
      }
      failures = 0;
      delay = refresh;
      updates += 1;
      document.body.dataset.updates = String(updates);
      setConn(true, "updated " + clock());
    } catch (e) {
      failures += 1;
      delay = Math.min(refresh * 2 ** failures, MAX_DELAY) * (0.8 + 0.4 * Math.random());
      document.body.dataset.failures = String(failures);
      setConn(false, `cannot reach the spool server (${e.message}); retrying in ${Math.round(delay / 1000)} s`);
    } finally {
      inflight = false;
    }
    timer = setTimeout(poll, delay);
  }

  if (!jobId) {
    $("lib-form").addEventListener("submit", (ev) => { ev.preventDefault(); searchLibrary(); });
    searchLibrary();
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer === null && !inflight) poll();
  });
  poll();
})();
