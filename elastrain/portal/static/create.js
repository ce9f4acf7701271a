"use strict";
/* Create-cluster form: the server validates; its 4xx message is shown next to the field it is about. */
const FIELDS = ["framework", "name", "containers", "image", "gpus", "shm", "mounts"];

/** Which form field an API error message is about (null: show it above the form). */
function fieldFor(message) {
  const m = message.toLowerCase();
  if (/cluster name|name:|is taken|dns label/.test(m)) return "name";
  if (/framework/.test(m)) return "framework";
  if (/gpus = |gpus per container|gpus_per_container/.test(m)) return "gpus";
  if (/containers must|containers:|containers \(/.test(m)) return "containers";
  if (/size|shm/.test(m)) return "shm";
  if (/mount/.test(m)) return "mounts";
  if (/image/.test(m)) return "image";
  return null;
}

function intOrNull(value) {
  const v = String(value).trim();
  return v === "" ? null : Number(v);
}

document.addEventListener("DOMContentLoaded", () => {
  const $ = (id) => document.getElementById(id);
  const form = $("create-form");
  const gpuOn = $("gpu-enabled");
  const shmOn = $("shm-enabled");

  function sync() {
    $("gpus").disabled = !gpuOn.checked;
    $("gpu-type").disabled = !gpuOn.checked;
    $("shm").disabled = !shmOn.checked;
  }
  gpuOn.addEventListener("change", sync);
  shmOn.addEventListener("change", sync);
  sync();

  Portal.api("GET", "/inventory").then((inv) => {
    const kind = inv.real ? "GPU (detected)" : "virtual GPU";
    $("gpu-type").replaceChildren(
      Portal.el("option", { value: inv.real ? "real" : "virtual" },
                `${kind}: ${inv.free} of ${inv.gpus} free`));
  }).catch((err) => Portal.showError(err.message));

  function clearErrors() {
    for (const f of FIELDS) Portal.fieldError(f, "");
    $("form-error").hidden = true;
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const source = $("mount-source").value.trim();
    const target = $("mount-target").value.trim();
    const body = {
      framework: (form.querySelector("input[name=framework]:checked") || {}).value || "",
      name: $("name").value.trim(),
      containers: intOrNull($("containers").value),
      image: $("image").value,
      gpus_per_container: gpuOn.checked ? intOrNull($("gpus").value) : 0,
      shm: shmOn.checked ? $("shm").value.trim() : "64Mi",
      mounts: source ? [source + ":" + (target || "/data")] : [],
    };
    const button = $("submit");
    button.disabled = true;
    try {
      const cluster = await Portal.api("POST", "/clusters", body);
      location.assign("/clusters/" + encodeURIComponent(cluster.name));
    } catch (err) {
      const field = fieldFor(err.message);
      if (field) {
        Portal.fieldError(field, err.message);
        const input = field === "framework" ? form.querySelector("input[name=framework]") : $(field);
        (input || $("name")).focus();
      } else {
        $("form-error").textContent = err.message;
        $("form-error").hidden = false;
      }
      button.disabled = false;
    }
  });
});
