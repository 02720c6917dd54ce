// The rayless dashboard: fetches /api/snapshot every second and renders it. No libraries.
"use strict";

function esc(value) {
  return String(value === undefined || value === null ? "-" : value)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

function table(id, headers, rows) {
  const el = document.getElementById(id);
  if (!rows.length) { el.innerHTML = '<div class="empty">none</div>'; return; }
  const head = "<tr>" + headers.map(h => "<th>" + esc(h) + "</th>").join("") + "</tr>";
  const body = rows.map(r => "<tr" + (r.id ? ' data-id="' + esc(r.id) + '"' : "") + ">" +
    r.cells.map(c => typeof c === "object" && c !== null
      ? '<td class="' + esc(c.cls || "") + '">' + esc(c.v) + "</td>"
      : '<td class="' + (typeof c === "number" ? "num" : "") + '">' + esc(c) + "</td>").join("") +
    "</tr>").join("");
  el.innerHTML = '<table id="' + id + '-table">' + head + body + "</table>";
}

function sum(obj) { return Object.values(obj || {}).reduce((a, b) => a + b, 0); }

function render(s) {
  const nodes = s.nodes || [];
  table("nodes", ["node", "alive", "CPUs used / total", "GPUs free / total", "GPU shares used", "GPU memory"],
    nodes.map(n => ({ id: n.node_id, cells: [
      n.node_id, { v: n.alive ? "yes" : "NO", cls: n.alive ? "alive" : "dead" },
      (n.cpus_used || 0) + " / " + (n.cpus || 0), (n.gpus_free || 0) + " / " + (n.gpus_total || 0),
      (n.gpus || []).map(g => g.index + ":" + (1 - (g.free || 0)).toFixed(2)).join(" ") || "-",
      (n.gpus || []).map(g => g.memory_bytes ? (g.memory_bytes / 2 ** 30).toFixed(0) + " GiB" : "?").join(" ") || "-",
    ] })));
  const stats = s.stats || {};
  const actors = [].concat(...nodes.map(n => n.actors || []));
  actors.sort((a, b) => String(a.name).localeCompare(String(b.name)));
  table("actors", ["actor", "class", "state", "restarts", "node", "pid", "in flight", "calls", "errors", "last error"],
    actors.map(a => {
      const st = stats[a.actor_id] || {};
      const death = a.death || {};
      return { id: a.name, cells: [
        a.name, a.cls, { v: a.state, cls: a.state }, a.restarts || 0, a.node_id, a.pid,
        (st.running || 0) + (st.queued || 0), sum(st.calls), sum(st.errors),
        { v: death.cause || death.reason || st.last_error || "", cls: "err" },
      ] };
    }));
  const parts = [], units = [];
  for (const m of s.stores || []) {
    const ctl = m.controller || {};
    for (const [name, p] of Object.entries(ctl.partitions || {})) {
      const consumers = Object.entries(p.consumers || {}).map(([t, n]) => t + ":" + n).join(" ");
      const fields = Object.entries(p.fields || {}).map(([f, n]) => f + ":" + n).join(" ");
      parts.push({ id: m.name + "/" + name, cells: [m.name, name, p.samples || 0, fields || "-", consumers || "-"] });
    }
    for (const u of m.units || []) {
      units.push({ cells: [m.name, u.unit_id, u.node_id, u.alive ? "yes" : "NO", u.rows || 0,
        u.bytes_used || 0, (u.puts || {}).per_s || 0, (u.gets || {}).per_s || 0] });
    }
  }
  table("partitions", ["store", "partition", "samples", "fields produced", "consumed per task"], parts);
  table("units", ["store", "unit", "node", "alive", "rows", "bytes", "puts/s", "gets/s"], units);
  table("weights", ["weights", "version", "relays"], Object.entries(s.weights || {}).map(
    ([name, w]) => ({ cells: [name, w.latest, Object.keys(w.relays || {}).join(" ") || "-"] })));
  drawTimeline(s.timeline || { processes: [] });
  document.getElementById("status").textContent = "updated " + new Date(s.time * 1000).toLocaleTimeString() +
    " · " + nodes.length + " nodes · " + actors.length + " actors";
}

const COLORS = { call: "#4e79a7", method: "#59a14f", store: "#f28e2b", weights: "#b07aa1", spawn: "#76b7b2" };

function drawTimeline(t) {
  const canvas = document.getElementById("timeline");
  const procs = t.processes || [];
  const row = 16, left = 190, width = canvas.width - left - 10;
  canvas.height = Math.max(40, procs.length * row + 24);
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "11px system-ui, sans-serif";
  if (!procs.length) {
    ctx.fillStyle = "#888";
    ctx.fillText("no spans: recording is off (RAYLESS_TIMELINE=0) or nothing ran in the last minute", 8, 24);
    return;
  }
  const windowMs = (t.window_s || 60) * 1000;
  procs.forEach((p, i) => {
    const y = i * row + 4;
    ctx.fillStyle = "#333";
    ctx.fillText(String(p.name).slice(0, 30), 4, y + 11);
    for (const [cat, , start, dur, failed] of p.spans) {
      const x = left + Math.max(0, start) / windowMs * width;
      ctx.fillStyle = failed ? "#b42318" : (COLORS[cat] || "#999");
      ctx.fillRect(x, y, Math.max(1, dur / windowMs * width), row - 4);
    }
  });
  ctx.fillStyle = "#666";
  ctx.fillText("-60 s", left, canvas.height - 4);
  ctx.fillText("now", left + width - 20, canvas.height - 4);
}

async function tick() {
  try {
    const r = await fetch("api/snapshot", { cache: "no-store" });
    const s = await r.json();
    if (!r.ok) throw new Error(s.error || r.status);
    render(s);
  } catch (e) {
    document.getElementById("status").textContent = "no snapshot: " + e;
  }
  setTimeout(tick, 1000);
}
tick();
