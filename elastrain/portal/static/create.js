"use strict";
/* Create-cluster form: the server validates; a 422 names every bad field (problem details `errors`),
   and each message is shown next to its field, all at once. */
const FIELDS = ["framework", "name", "containers", "min-containers", "max-containers", "priority", "image",
  "gpus", "gpu-type", "idle-release", "shm", "mounts"];
/** The form field of a request field (`loc` "body.NAME" or "body.NAME.INDEX"). */
const FIELD_OF = {
  name: "name", framework: "framework", containers: "containers", min_containers: "min-containers",
  max_containers: "max-containers", priority: "priority", image: "image", gpus_per_container: "gpus",
  gpu_type: "gpu-type", shm: "shm", mounts: "mounts", idle_release_after: "idle-release",
};

/** The form field a problem's `loc` is about (null: not on the form). */
function fieldOfLoc(loc) {
  const parts = String(loc).split(".");
  return parts[0] === "body" ? FIELD_OF[parts[1]] || null : null;
}

/** Which form field an API error message is about (null: show it above the form). */
function fieldFor(message) {
  const m = message.toLowerCase();
  if (/cluster name|name:|is taken|not available|cluster named|dns label/.test(m)) return "name";
  if (/framework/.test(m)) return "framework";
  if (/gpu_type| gpu\(s\) needed/.test(m)) return "gpu-type";
  if (/min_containers/.test(m)) return "min-containers";
  if (/max_containers/.test(m)) return "max-containers";
  if (/priority/.test(m)) return "priority";
  if (/gpus = |gpus per container|gpus_per_container/.test(m)) return "gpus";
  if (/containers must|containers:|containers \(/.test(m)) return "containers";
  if (/size|shm/.test(m)) return "shm";
  if (/mount/.test(m)) return "mounts";
  if (/image/.test(m)) return "image";
  return null;
}

/** The default bounds of `containers` (the seed's flow elastic with no edit): min = the containers,
 *  max = twice them, but no more than the node's GPUs (of the chosen model) hold at `gpus` per
 *  container (never below min). */
function defaultBounds(containers, gpus, totalGpus) {
  const max = gpus > 0 && totalGpus != null ? Math.min(2 * containers, Math.floor(totalGpus / gpus)) : 2 * containers;
  return [containers, Math.max(containers, max)];
}

/** A byte count for people: 1.4 GB, 820 MB ("" when unknown). */
function bytes(n) {
  if (!n) return "";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return (i === 0 || n >= 10 ? Math.round(n) : n.toFixed(1)) + " " + units[i];
}

/** Whether `image` (GET /api/v1/images) holds `framework`; the process backend's "local" holds any. */
function holds(image, framework) {
  return image.name === "local" || image.frameworks.includes(framework);
}

/** The image the server picks for `framework` when the select is left on the default (the server
 *  names it in `default_for`; the process backend's "local" is the only holder there). */
function defaultImage(holders, framework) {
  return holders.find((i) => (i.default_for || []).includes(framework)) || holders[0];
}

/** An option's text: `name — frameworks, size`. */
function imageLabel(image) {
  if (image.name === "local") return "local — any framework (" + (image.description || "no container image") + ")";
  const what = image.frameworks.length ? image.frameworks.map(Portal.framework).join(", ") : "no framework";
  const size = bytes(image.size_bytes);
  return image.name + " — " + what + (size ? ", " + size : "");
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
    $("idle-release").disabled = !gpuOn.checked;
    $("shm").disabled = !shmOn.checked;
  }
  gpuOn.addEventListener("change", sync);
  shmOn.addEventListener("change", sync);
  sync();

  // Min and max follow the containers (and the GPUs they need) until the user edits them.
  let totalGpus = null; // the node's GPUs, once GET /inventory answered
  let modelGpus = new Map(); // its GPUs per named model
  const suggested = { "min-containers": null, "max-containers": null };
  function followBounds() {
    const containers = intOrNull($("containers").value);
    if (!Number.isInteger(containers) || containers < 2) return;
    const gpus = gpuOn.checked ? intOrNull($("gpus").value) || 0 : 0;
    const model = gpuOn.checked ? $("gpu-type").value : "";
    const [low, high] = defaultBounds(containers, gpus, model ? modelGpus.get(model) ?? totalGpus : totalGpus);
    for (const [id, value] of [["min-containers", low], ["max-containers", high]]) {
      const box = $(id);
      if (suggested[id] === null || box.value === String(suggested[id])) box.value = String(value);
      suggested[id] = value;
    }
  }
  for (const id of ["containers", "gpus", "gpu-enabled", "gpu-type"]) {
    $(id).addEventListener("input", followBounds);
    $(id).addEventListener("change", followBounds);
  }
  followBounds();

  // GPU type: "any" (gpu_type null), then each model the node's inventory names (NVML's device name)
  Portal.api("GET", "/inventory").then((inv) => {
    totalGpus = inv.gpus;
    followBounds();
    const kind = inv.real ? "GPU (detected)" : "virtual GPU";
    modelGpus = new Map((inv.models || []).map((m) => [m.model, m.gpus]));
    $("gpu-type").replaceChildren(
      Portal.el("option", { value: "" }, `any ${kind}: ${inv.free} of ${inv.gpus} free`),
      ...(inv.models || []).map((m) => Portal.el("option", { value: m.model }, `${m.model}: ${m.free} of ${m.gpus} free`)));
  }).catch((err) => Portal.showError(err.message));

  // The image select: "default image of the framework" (value "") then every image the backend has.
  const imageNote = $("image-note");
  const defaultNote = imageNote.textContent;
  let images = null; // null until GET /images answered
  const chosenFramework = () => (form.querySelector("input[name=framework]:checked") || {}).value || "";

  function imageHint() {
    const framework = chosenFramework();
    if (images === null || !framework) return;
    const holders = images.filter((i) => holds(i, framework));
    const picked = images.find((i) => i.name === $("image").value);
    if (!holders.length) {
      const build = "elastrain image build --framework " + framework;
      imageNote.replaceChildren(
        `no image holds ${framework} yet: build one with `, Portal.el("code", {}, build));
    } else if (picked && !holds(picked, framework)) {
      imageNote.textContent = `${picked.name} does not hold ${framework}: ` +
        `leave the default (${defaultImage(holders, framework).name}) or pick an image that does`;
    } else if (!picked) {
      imageNote.textContent = `default for ${framework}: ${defaultImage(holders, framework).name}`;
    } else {
      imageNote.textContent = defaultNote;
    }
  }
  for (const radio of form.querySelectorAll("input[name=framework]")) {
    radio.addEventListener("change", () => { Portal.fieldError("framework", ""); imageHint(); });
  }
  $("image").addEventListener("change", imageHint);

  Portal.api("GET", "/storage").then((areas) => {
    $("mount-area").append(...areas.map((a) => Portal.el("option", { value: "storage:" + a.name }, a.name)));
  }).catch(() => {});

  Portal.api("GET", "/images").then((found) => {
    images = found;
    $("image").append(...found.map((i) => Portal.el("option", { value: i.name }, imageLabel(i))));
    imageHint();
  }).catch((err) => { imageNote.textContent = "the image list is unavailable: " + err.message; });

  function clearErrors() {
    for (const f of FIELDS) Portal.fieldError(f, "");
    $("form-error").hidden = true;
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const source = $("mount-area").value || $("mount-source").value.trim();
    const target = $("mount-target").value.trim();
    const body = {
      framework: chosenFramework(),
      name: $("name").value.trim(),
      containers: intOrNull($("containers").value),
      min_containers: intOrNull($("min-containers").value),
      max_containers: intOrNull($("max-containers").value),
      priority: intOrNull($("priority").value) ?? 0,
      image: $("image").value,
      gpus_per_container: gpuOn.checked ? intOrNull($("gpus").value) : 0,
      gpu_type: gpuOn.checked && $("gpu-type").value ? $("gpu-type").value : null,
      idle_release_after: gpuOn.checked ? intOrNull($("idle-release").value) : null,
      shm: shmOn.checked ? $("shm").value.trim() : "64Mi",
      mounts: source ? [source + ":" + (target || "/data")] : [],
    };
    const button = $("submit");
    button.disabled = true;
    try {
      const cluster = await Portal.api("POST", "/clusters", body);
      location.assign("/clusters/" + encodeURIComponent(cluster.name));
    } catch (err) {
      showRefusal(err);
      button.disabled = false;
    }
  });

  /** Mark every bad field at once (a field with several refusals shows them all); what is not about a
   *  form field goes above the form. The first bad field gets the focus. */
  function showRefusal(err) {
    const listed = (err.errors || []).length > 0;
    const found = listed ? err.errors : [{ loc: "", message: err.message }];
    const byField = new Map();
    const elsewhere = [];
    for (const e of found) {
      const field = listed ? fieldOfLoc(e.loc) : fieldFor(e.message);
      if (field) byField.set(field, [...(byField.get(field) || []), e.message]);
      else elsewhere.push(e.loc ? `${e.loc.replace(/^body\./, "")}: ${e.message}` : e.message);
    }
    for (const [field, messages] of byField) Portal.fieldError(field, messages.join("; "));
    if (elsewhere.length) {
      $("form-error").textContent = elsewhere.join("; ");
      $("form-error").hidden = false;
    }
    const first = FIELDS.find((f) => byField.has(f));
    if (first) {
      const input = first === "framework" ? form.querySelector("input[name=framework]") : $(first);
      (input || $("name")).focus();
    }
  }
});
