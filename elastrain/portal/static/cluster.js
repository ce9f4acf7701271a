"use strict";
/** Split a command line like a POSIX shell does for words: quotes and backslashes, no expansion. */
function shellSplit(line) {
  const words = [];
  let word = null;
  let quote = null;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i];
    if (quote) {
      if (ch === quote) quote = null;
      else if (ch === "\\" && quote === '"' && i + 1 < line.length) word += line[++i];
      else word += ch;
    } else if (ch === "'" || ch === '"') { quote = ch; word = word ?? ""; }
    else if (ch === "\\" && i + 1 < line.length) { word = (word ?? "") + line[++i]; }
    else if (/\s/.test(ch)) { if (word !== null) { words.push(word); word = null; } }
    else word = (word ?? "") + ch;
  }
  if (quote) throw new Error("unterminated " + quote + " quote in the command");
  if (word !== null) words.push(word);
  return words;
}

/* One cluster: containers, hostfile, jobs and events, refreshed every second without a reload. */
document.addEventListener("DOMContentLoaded", () => {
  const { api, el, stateBadge } = Portal;
  const $ = (id) => document.getElementById(id);
  const name = document.body.dataset.cluster;
  const path = "/clusters/" + encodeURIComponent(name);
  let cluster = null;
  let prefill = null; // the first job's command as last put in the job box

  /** The first job, as the server words it (`first_job`: the same worker range as "Run training"). */
  function firstJob(c) {
    return c.first_job;
  }

  /** Put the first job in the job box, and follow the cluster's size until the user edits it. */
  function suggest(c) {
    const box = $("job-command");
    const command = firstJob(c);
    if ((prefill === null || box.value === prefill) && box.value !== command) box.value = command;
    prefill = command;
  }

  /** The size in words: how many containers now, the bounds, and why (the scheduler's reason). */
  function sizeText(c) {
    const elastic = c.min_containers !== c.max_containers;
    const bounds = elastic ? `elastic between ${c.min_containers} and ${c.max_containers}` : "fixed size";
    const why = c.size_reason ? `: ${c.size_reason}` : "";
    return `${c.desired_containers} containers (${bounds}, priority ${c.priority})${why}`;
  }

  function summary(c) {
    const running = c.containers.filter((k) => k.state === "Running").length;
    const items = [
      ["Framework", Portal.framework(c.framework)], ["Size", sizeText(c)],
      ["Containers", `${running}/${c.desired_containers} Running`],
      ["GPUs per container", String(c.gpus_per_container)],
      ["GPU type", c.gpu_type || "any"], ["Shared memory", c.shm],
      ["Image", c.image], ["Storage", c.mounts.length ? c.mounts.join(", ") : "none"],
      ["Owner", c.owner], ["Run training", c.launch_hint],
    ];
    if (c.reason) items.splice(2, 0, ["Reason", c.reason]);
    $("cluster-summary").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  function containerRow(k) {
    const gpus = k.gpu_ids.length ? `${k.gpus} (${k.gpu_ids.join(",")})` : String(k.gpus);
    return el("tr", { "data-container": k.name },
      el("td", { "data-label": "Name" }, k.name),
      el("td", { "data-label": "Role" }, k.role),
      el("td", { "data-label": "Address" }, k.address || "-"),
      el("td", { "data-label": "GPUs" }, gpus),
      el("td", { "data-label": "State", class: "container-state" }, stateBadge(k.state),
         k.reason ? el("span", { class: "reason" }, " " + k.reason) : ""),
      el("td", { "data-label": "Started" }, formatTime(k.started_at)));
  }

  function jobRow(j) {
    return el("tr", { "data-job": String(j.id) },
      el("td", { "data-label": "Job" }, el("a", { href: "/jobs/" + j.id }, "#" + j.id)),
      el("td", { "data-label": "Status" }, stateBadge(j.status)),
      el("td", { "data-label": "World size" }, j.world_size ?? "-"),
      el("td", { "data-label": "Step" }, j.step ?? "-"),
      el("td", { "data-label": "Loss" }, j.loss == null ? "-" : j.loss.toFixed(4)),
      el("td", { "data-label": "Command", class: "cmd" }, j.command.join(" ")));
  }

  async function refresh() {
    try {
      cluster = await api("GET", path);
    } catch (err) {
      if (err.status === 404) {
        $("cluster-view").hidden = true;
        throw new Portal.ApiError(404, `Cluster “${name}” not found.`);
      }
      throw err;
    }
    $("cluster-view").hidden = false;
    $("cluster-state").replaceChildren(stateBadge(cluster.state));
    summary(cluster);
    $("containers-body").replaceChildren(...cluster.containers.map(containerRow));
    suggest(cluster);
    const [hostfile, events, jobs] = await Promise.all([
      api("GET", path + "/hostfile"), api("GET", path + "/events"),
      api("GET", "/jobs?cluster=" + encodeURIComponent(name)),
    ]);
    $("hostfile-generation").textContent = `(generation ${cluster.hostfile_generation})`;
    $("hostfile").textContent = hostfile || "(empty: no Running workers yet)";
    $("events-body").replaceChildren(...events.slice().reverse().map((e) => el("tr", {},
      el("td", { "data-label": "Time" }, formatTime(e.at)),
      el("td", { "data-label": "By" }, e.actor),
      el("td", { "data-label": "Event" }, e.text || e.action))));
    $("jobs-body").replaceChildren(...jobs.slice().reverse().map(jobRow));
    $("jobs-empty").hidden = jobs.length > 0;
    return true;
  }

  /** Bytes for people, in binary units as the limits are written (1.5 GiB, 820 MiB). */
  function ibytes(n) {
    if (n == null) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 || n >= 10 ? Math.round(n) : n.toFixed(1)) + "\u00a0" + units[i];
  }

  /** One container's resource figures: what is not known says so, never a made-up number. */
  function usageRow(k) {
    const cores = k.cpu_limit_cores;
    const limit = cores ? ` (limit ${cores} core${cores === 1 ? "" : "s"})` : "";
    const cpu = k.cpu_percent == null ? (k.cpu_seconds == null ? "not available" : "measuring…")
      : `${k.cpu_percent.toFixed(1)}\u00a0%` + limit;
    const memory = k.memory_bytes == null ? "not available"
      : `${ibytes(k.memory_bytes)} / ${k.memory_limit_bytes == null ? "no limit" : ibytes(k.memory_limit_bytes)}`;
    const gpu = k.gpus.length ? k.gpus.map((g) => `GPU ${g.index}: ` +
        `${g.utilization_percent == null ? "-" : g.utilization_percent + " %"}, ` +
        `${ibytes(g.memory_used_bytes)} / ${ibytes(g.memory_total_bytes)}`).join("; ")
      : (k.gpu_note || "no GPUs");
    return el("tr", { "data-container": k.name, "data-source": k.source },
      el("td", { "data-label": "Container" }, k.name),
      el("td", { "data-label": "CPU", class: "usage-cpu" }, cpu),
      el("td", { "data-label": "Memory", class: "usage-memory" }, memory),
      el("td", { "data-label": "GPU", class: "usage-gpu" }, gpu),
      el("td", { "data-label": "Source" }, k.source, k.note ? el("span", { class: "reason" }, " " + k.note) : ""));
  }

  async function refreshUsage() {
    if (!cluster) return true;
    const usage = await api("GET", path + "/usage");
    $("usage-gpu-model").textContent = usage.gpu_model ? `(${usage.gpu_model})` : "";
    $("usage-body").replaceChildren(...usage.containers.map(usageRow));
    return true;
  }

  $("scale-open").addEventListener("click", () => { if (cluster) ScalePanel.open(cluster, refresh); });
  // "Open JupyterLab" posts this tab's token (never in a URL) to a new tab: the lab's session cookie
  $("lab-form").addEventListener("submit", () => { $("lab-token").value = Portal.token(); });
  $("delete-open").addEventListener("click", async () => {
    if (!(await confirmDelete(name))) return;
    try { await api("DELETE", path); location.assign("/clusters"); }
    catch (err) { Portal.showError(err.message); }
  });
  $("job-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    Portal.fieldError("job-command", "");
    try {
      const command = shellSplit($("job-command").value);
      if (!command.length) throw new Error("type the command to run, e.g. " + (cluster ? firstJob(cluster) : ""));
      const tensorboard = $("job-tensorboard").value.trim();
      const job = await api("POST", path + "/jobs",
        tensorboard ? { command, tensorboard_dir: tensorboard } : { command });
      location.assign("/jobs/" + job.id);
    } catch (err) { Portal.fieldError("job-command", err.message); }
  });
  Portal.poll(refresh, 1000);
  Portal.poll(refreshUsage, 2000);
});
