"use strict";
/* A job: live uPlot charts of loss, samples/s, world size and any other figure it reports with
   elastrain.report() (resize events marked), its incidents (restarts for torchrun-style scripts),
   checkpoints and the log tail. */
document.addEventListener("DOMContentLoaded", () => {
  const { api, el, stateBadge } = Portal;
  const $ = (id) => document.getElementById(id);
  const jobId = document.body.dataset.job;
  const MAX_LOG_CHARS = 200000;
  const series = { t: [], loss: [], sps: [], world: [] };
  const scalarNames = [];  // other figures (elastrain.report), in the order they first appeared; series["s:" + name]
  const SCALAR_COLORS = ["#db2777", "#0891b2", "#ca8a04", "#4f46e5", "#16a34a", "#9333ea"];
  const incidentCounts = { incidents: 0, restarts: null };
  const resizes = [];  // {t, from, to}
  let lastMetric = 0;
  let lastWorld = null;
  let logOffset = 0;
  let charts = [];
  let finished = false;

  function clock(seconds) {
    return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
  }

  function markResizes(u) {
    const ctx = u.ctx;
    const { top, height } = u.bbox;
    ctx.save();
    ctx.strokeStyle = "#c2410c";
    ctx.setLineDash([6, 4]);
    ctx.lineWidth = 1.5 * devicePixelRatio;
    for (const r of resizes) {
      const x = Math.round(u.valToPos(r.t, "x", true));
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
    }
    ctx.restore();
  }

  function makeChart(id, label, key, color, stepped) {
    const box = typeof id === "string" ? $(id) : id;
    const opts = {
      width: Math.max(260, box.clientWidth - 8), height: 200,
      cursor: { sync: { key: "job" } },
      legend: { show: true },
      scales: { x: { time: true } },
      series: [{}, { label, stroke: color, width: 2, spanGaps: true,
                     paths: stepped ? uPlot.paths.stepped({ align: 1 }) : undefined }],
      axes: [{ space: 80, values: (u, splits) => splits.map(clock) }, { size: 60 }],
      hooks: { draw: [markResizes] },
    };
    return { chart: new uPlot(opts, [series.t, series[key]], box), key, box };
  }

  function addScalarCharts() {
    for (const name of scalarNames) {
      if (charts.some((c) => c.key === "s:" + name)) continue;
      const box = el("figure", { class: "chart", "aria-label": `${name} over time` }, el("figcaption", {}, name),
        el("p", { class: "no-data note", hidden: "" }, `No ${name} reported yet.`));
      box.dataset.scalar = name;
      $("scalar-charts").append(box);
      const color = SCALAR_COLORS[(scalarNames.indexOf(name)) % SCALAR_COLORS.length];
      charts.push(makeChart(box, name, "s:" + name, color, false));
    }
    $("scalars-note").hidden = scalarNames.length === 0;
  }

  function redraw() {
    addScalarCharts();
    for (const c of charts) {
      c.chart.setData([series.t, series[c.key]]);
      const none = series.t.length > 0 && series[c.key].every((v) => v == null);
      c.box.querySelector(".no-data").hidden = !none;
    }
    $("resize-list").replaceChildren(...resizes.map((r) => {
      const at = new Date(r.t * 1000).toISOString();
      return el("li", {}, formatTime(at, Portal.time(at)), `: world size ${r.from} → ${r.to}`);
    }));
  }

  function add(m) {
    if (m.id <= lastMetric) return;  // two polls in flight may both fetch a row: count it once
    series.t.push(Date.parse(m.at) / 1000);
    series.loss.push(m.loss);
    series.sps.push(m.samples_per_s);
    const scalars = m.scalars || {};
    for (const name of Object.keys(scalars)) {
      if (!scalarNames.includes(name)) {
        scalarNames.push(name);
        series["s:" + name] = new Array(series.t.length - 1).fill(null);
      }
    }
    for (const name of scalarNames) series["s:" + name].push(scalars[name] ?? null);
    let world = m.world_size ?? lastWorld;
    if (m.world_size != null && lastWorld != null && m.world_size !== lastWorld) {
      resizes.push({ t: Date.parse(m.at) / 1000, from: lastWorld, to: m.world_size });
    }
    if (m.world_size != null) lastWorld = m.world_size;
    series.world.push(world);
    lastMetric = m.id;
  }

  async function metrics() {
    const rows = await api("GET", `/jobs/${jobId}/metrics?after=${lastMetric}`);
    rows.forEach(add);
    if (rows.length) redraw();
  }

  async function logs() {
    const { data, headers } = await api("GET", `/jobs/${jobId}/logs?offset=${logOffset}`, undefined,
                                        { withHeaders: true });
    logOffset = Number(headers.get("X-Next-Offset") || logOffset);
    if (data) {
      const pre = $("job-log");
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
      let text = pre.textContent + data;
      if (text.length > MAX_LOG_CHARS) text = text.slice(text.length - MAX_LOG_CHARS);
      pre.textContent = text;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
  }

  // "2 -> 4 in 0.57 s, 4 -> 3 in 0.03 s; 0 processes restarted": what each resize cost the job
  function resizeSummary(resizes) {
    const steps = resizes.map((r) => `${r.from_world} → ${r.to_world}` +
      (r.pause_s == null ? "" : ` in ${r.pause_s.toFixed(2)} s`));
    const restarted = resizes.reduce((n, r) => n + r.restarted_processes, 0);
    return `${steps.join(", ")}; ${restarted} process${restarted === 1 ? "" : "es"} restarted`;
  }

  function showJob(j) {
    $("job-status").replaceChildren(stateBadge(j.status));
    const link = $("job-cluster-link");
    link.textContent = j.cluster;
    link.href = "/clusters/" + encodeURIComponent(j.cluster);
    const items = [
      ["Cluster", j.cluster], ["Command", j.command.join(" ")], ["Started", formatTime(j.created_at)],
      ["Step", j.step ?? "-"], ["Epoch", j.epoch ?? "-"],
      ["Loss", j.loss == null ? "-" : j.loss.toFixed(4)],
      ["Samples/s", j.samples_per_s == null ? "-" : j.samples_per_s.toFixed(1)],
      ["World size", j.world_size ?? "-"],
    ];
    items.push(["Incidents", incidentCounts.incidents]);
    if (j.resizes && j.resizes.length) items.push(["Resizes", resizeSummary(j.resizes)]);
    if (incidentCounts.restarts != null) items.push(["Restarts", incidentCounts.restarts]);
    if (j.tensorboard_dir) items.push(["TensorBoard", el("code", {}, j.tensorboard_dir)]);
    if (j.finished_at) items.push(["Finished", formatTime(j.finished_at)], ["Exit code", j.exit_code ?? "-"]);
    $("job-summary").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v instanceof Node ? v : String(v))]));
    $("job-cancel").hidden = j.status !== "Running";
  }

  function checkpointRow(c) {
    const mb = (c.bytes / 1048576).toFixed(c.bytes < 10485760 ? 2 : 0) + " MB";
    return el("tr", { "data-step": String(c.step) },
      el("td", { "data-label": "Step" }, String(c.step)),
      el("td", { "data-label": "Epoch" }, String(c.epoch)),
      el("td", { "data-label": "World size" }, String(c.world_size)),
      el("td", { "data-label": "Size" }, mb),
      el("td", { "data-label": "Write time" }, c.write_s.toFixed(3) + " s"),
      el("td", { "data-label": "Written" }, formatTime(c.at)),
      el("td", { "data-label": "Path", class: "cmd" }, c.path));
  }

  async function checkpoints() {
    const rows = await api("GET", `/jobs/${jobId}/checkpoints`);
    $("checkpoints-empty").hidden = rows.length > 0;
    $("checkpoints-table").hidden = rows.length === 0;
    $("checkpoints-body").replaceChildren(...rows.map(checkpointRow));
  }

  function seconds(value) {
    return value == null ? "-" : Number(value).toFixed(3) + " s";
  }

  function incidentRow(i, at) {
    const scripts = i.cause === "start" ? "started" : i.restarted === true ? "restarted"
      : i.restarted === false ? "started" : "resized live";
    return el("tr", { "data-generation": String(i.generation) },
      el("td", { "data-label": "Generation" }, String(i.generation)),
      el("td", { "data-label": "Cause" }, String(i.cause).replace(/_/g, " ")),
      el("td", { "data-label": "World size" }, String(i.world_size)),
      el("td", { "data-label": "Steps lost" }, String(i.steps_lost ?? "-")),
      el("td", { "data-label": "Detect" }, seconds(i.detect_s)),
      el("td", { "data-label": "Pause" }, seconds(i.recover_s)),
      el("td", { "data-label": "Scripts" }, scripts),
      el("td", { "data-label": "Formed" }, formatTime(i.formed_at || at)));
  }

  async function incidents() {
    const events = await api("GET", `/jobs/${jobId}/events`);
    const found = events.filter((e) => e.action === "job.incident");
    const details = found.map((e) => e.detail);
    incidentCounts.incidents = details.filter((i) => i.cause !== "start").length;
    const restartMode = details.some((i) => i.restarted != null);
    incidentCounts.restarts = restartMode ? details.filter((i) => i.restarted === true).length : null;
    $("incidents-empty").hidden = found.length > 0;
    $("incidents-table").hidden = found.length === 0;
    $("incidents-body").replaceChildren(...found.map((e) => incidentRow(e.detail, e.at)));
  }

  async function refresh() {
    let job;
    try {
      job = await api("GET", "/jobs/" + jobId);
    } catch (err) {
      if (err.status === 404) {
        $("job-view").hidden = true;
        throw new Portal.ApiError(404, `Job ${jobId} not found.`);
      }
      throw err;
    }
    $("job-view").hidden = false;
    if (!charts.length) {
      charts = [
        makeChart("chart-loss", "loss", "loss", "#2563eb", false),
        makeChart("chart-sps", "samples/s", "sps", "#059669", false),
        makeChart("chart-world", "world size", "world", "#7c3aed", true),
      ];
    }
    await Promise.all([metrics(), logs(), checkpoints(), incidents()]);
    showJob(job);
    if (job.status !== "Running" && job.status !== "Pending") {
      if (finished) return false;  // one more round after the end, to catch the last lines
      finished = true;
    }
    return true;
  }

  window.addEventListener("resize", () => {
    for (const c of charts) c.chart.setSize({ width: Math.max(260, c.box.clientWidth - 8), height: 200 });
  });
  $("job-cancel").addEventListener("click", async () => {
    try { await api("DELETE", "/jobs/" + jobId); } catch (err) { Portal.showError(err.message); }
  });
  Portal.poll(refresh, 1000);
});
