"use strict";
/* The clusters list: polled every 2 s; select one row to scale it; delete with confirmation. */
document.addEventListener("DOMContentLoaded", () => {
  const { api, el, stateBadge, age } = Portal;
  const body = document.getElementById("clusters-body");
  const scaleButton = document.getElementById("scale-selected");
  let clusters = [];
  const selected = new Set();

  function updateScaleButton() {
    scaleButton.disabled = selected.size !== 1;
    scaleButton.title = selected.size === 1 ? "" : "Select one cluster to scale";
  }

  function row(c) {
    const running = c.containers.filter((k) => k.state === "Running").length;
    const gpus = c.desired_containers * c.gpus_per_container;
    const box = el("input", { type: "checkbox", "aria-label": "Select cluster " + c.name,
                              checked: selected.has(c.name) });
    box.addEventListener("change", () => {
      if (box.checked) selected.add(c.name); else selected.delete(c.name);
      updateScaleButton();
    });
    const del = el("button", { type: "button", class: "danger small", "aria-label": "Delete cluster " + c.name },
                   "Delete");
    del.addEventListener("click", async () => {
      if (!(await confirmDelete(c.name))) return;
      try { await api("DELETE", "/clusters/" + encodeURIComponent(c.name)); refresh(); }
      catch (err) { Portal.showError(err.message); }
    });
    return el("tr", { "data-cluster": c.name },
      el("td", {}, box),
      el("td", { "data-label": "Name" }, el("a", { href: "/clusters/" + encodeURIComponent(c.name) }, c.name)),
      el("td", { "data-label": "Framework" }, Portal.framework(c.framework)),
      el("td", { "data-label": "Containers", class: "containers" }, `${running}/${c.desired_containers}`),
      el("td", { "data-label": "GPUs" }, String(gpus)),
      el("td", { "data-label": "Age" }, formatTime(c.created_at, age(c.created_at))),
      el("td", { "data-label": "State" }, stateBadge(c.state),
         c.reason && c.state !== "Running" ? el("span", { class: "reason" }, " " + c.reason) : ""),
      el("td", {}, del));
  }

  async function refresh() {
    clusters = await api("GET", "/clusters");
    const names = new Set(clusters.map((c) => c.name));
    for (const n of [...selected]) if (!names.has(n)) selected.delete(n);
    body.replaceChildren(...clusters.map(row));
    document.getElementById("clusters-empty").hidden = clusters.length > 0;
    updateScaleButton();
  }

  async function inventory() {
    const inv = await api("GET", "/inventory");
    document.getElementById("inventory-line").textContent =
      `${inv.free} of ${inv.gpus} ${inv.real ? "" : "virtual "}GPUs free on this node.`;
  }

  scaleButton.addEventListener("click", () => {
    const c = clusters.find((k) => selected.has(k.name));
    if (c) ScalePanel.open(c, () => refresh());
  });
  Portal.poll(async () => { await refresh(); await inventory(); }, 2000);
});
