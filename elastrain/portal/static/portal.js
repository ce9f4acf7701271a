/* elastrain portal: shared helpers. Only the public REST API under /api/v1 is used; the API token
   lives in sessionStorage (this tab only). */
"use strict";

const Portal = (() => {
  const KEY = "elastrain-token";

  /** A refusal: `message` is the problem's detail; `errors` its [{loc, message}] (every bad field). */
  class ApiError extends Error {
    constructor(status, message, errors = [], type = "") {
      super(message);
      this.status = status;
      this.errors = errors;
      this.type = type;
    }
  }

  function token() { return sessionStorage.getItem(KEY) || ""; }
  function setToken(value) { sessionStorage.setItem(KEY, value); }
  function signOut() { sessionStorage.removeItem(KEY); location.assign("/signin"); }

  /** Where to go after signing in: `next` only when it is a path of this origin, else "/". A
   *  backslash, a control character or a second leading slash could make the browser leave this
   *  origin (`/\\evil`, `/%09/evil` and `//evil` all mean evil's host to it), so those are refused before
   *  the URL is resolved, and the resolved URL must still be of this origin. */
  function safeNext(next) {
    if (typeof next !== "string" || !/^\/(?![\/\\])[^\\\x00-\x20\x7f]*$/.test(next)) return "/";
    try {
      const url = new URL(next, location.origin);
      return url.origin === location.origin ? url.pathname + url.search + url.hash : "/";
    } catch (err) {
      return "/";
    }
  }

  function toSignIn() {
    const next = location.pathname + location.search;
    location.assign("/signin?next=" + encodeURIComponent(next));
  }

  /** Call the REST API; JSON in/out (text for text/plain answers). Throws ApiError on 4xx/5xx, from
   *  the answer's problem details (RFC 9457: detail, errors). */
  async function api(method, path, body, opts = {}) {
    const headers = { Authorization: "Bearer " + (opts.token ?? token()) };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch("/api/v1" + path, {
        method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      throw new ApiError(0, "cannot reach the server (" + err.message + ")");
    }
    const type = resp.headers.get("content-type") || "";
    const data = type.includes("json") ? await resp.json().catch(() => null) : await resp.text();
    if (!resp.ok) {
      const problem = data && typeof data === "object" ? data : {};
      const message = problem.detail || problem.error || (typeof data === "string" && data) || resp.statusText;
      const errors = Array.isArray(problem.errors) ? problem.errors : [];
      if (resp.status === 401 && !opts.token) toSignIn();
      throw new ApiError(resp.status, message, errors, problem.type || "");
    }
    if (opts.withHeaders) return { data, headers: resp.headers };
    return data;
  }

  /** Create an element: el("td", {class: "x"}, "text", child...). Text is never parsed as HTML. */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }

  const FRAMEWORKS = { horovod: "Horovod", deepspeed: "DeepSpeed", megatron: "Megatron-LM",
                       pytorch: "PyTorch", slurm: "Slurm" };
  function framework(value) { return FRAMEWORKS[value] || value; }

  function stateBadge(state) {
    return el("span", { class: "state state-" + String(state).toLowerCase() }, state);
  }

  function age(iso) {
    if (!iso) return "-";
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) return Math.floor(s) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h";
    return Math.floor(s / 86400) + "d";
  }

  function time(iso) {
    if (!iso) return "-";
    return new Date(iso).toLocaleTimeString([], { hour12: false });
  }

  function dateTime(iso) {
    if (!iso) return "-";
    const d = new Date(iso);
    return d.toLocaleDateString() + " " + d.toLocaleTimeString([], { hour12: false });
  }

  /** Run `fn` now and every `ms` until it returns false; errors are shown, polling goes on. */
  function poll(fn, ms) {
    let stopped = false;
    async function tick() {
      if (stopped) return;
      let again = true;
      try {
        again = (await fn()) !== false;
        showError("");
      } catch (err) {
        if (err.status === 404) again = false;
        showError(err.message);
      }
      if (again && !stopped) setTimeout(tick, document.hidden ? ms * 4 : ms);
    }
    tick();
    return () => { stopped = true; };
  }

  function showError(message) {
    const box = document.getElementById("page-error");
    if (!box) return;
    box.textContent = message || "";
    box.hidden = !message;
  }

  function fieldError(id, message) {
    const p = document.getElementById(id + "-error");
    const input = document.getElementById(id);
    if (p) { p.textContent = message || ""; p.hidden = !message; }
    if (input) {
      if (message) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
  }

  /** Every page but sign-in needs a token; show who is signed in. */
  async function init() {
    const page = document.body.dataset.page;
    document.getElementById("signout")?.addEventListener("click", signOut);
    if (page === "signin") return;
    if (!token()) { toSignIn(); return; }
    try {
      const me = await api("GET", "/me");
      document.getElementById("who-name").textContent = me.name + (me.admin ? " (admin)" : "");
      document.getElementById("who").hidden = false;
    } catch (err) {
      showError(err.message);
    }
  }

  document.addEventListener("DOMContentLoaded", init);
  return { api, ApiError, framework, token, setToken, signOut, safeNext, el, stateBadge, age, time, dateTime, poll,
           showError, fieldError };
})();

/* The scale panel (on the clusters list and the cluster page). */
const ScalePanel = (() => {
  let current = null;
  let onDone = null;
  function $(id) { return document.getElementById(id); }

  function open(cluster, done) {
    current = cluster;
    onDone = done;
    const running = cluster.containers.filter((c) => c.state === "Running").length;
    $("scale-cluster").textContent = cluster.name;
    $("scale-current").textContent = `${running}/${cluster.desired_containers} containers running`;
    $("scale-count").value = cluster.desired_containers;
    Portal.fieldError("scale-count", "");
    $("scale-panel").hidden = false;
    $("scale-count").focus();
  }

  function close() { $("scale-panel").hidden = true; current = null; }

  document.addEventListener("DOMContentLoaded", () => {
    const form = $("scale-form");
    if (!form) return;
    $("scale-cancel").addEventListener("click", close);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (!current) return;
      const raw = $("scale-count").value.trim();
      const count = raw === "" ? null : Number(raw);
      try {
        const out = await Portal.api("PATCH", "/clusters/" + encodeURIComponent(current.name),
                                     { containers: count });
        close();
        if (onDone) onDone(out);
      } catch (err) {
        const bad = (err.errors || []).find((e) => e.loc === "body.containers");
        Portal.fieldError("scale-count", bad ? bad.message : err.message);
      }
    });
  });
  return { open, close };
})();

/* The delete confirmation (a <dialog>). */
function confirmDelete(name) {
  const dialog = document.getElementById("delete-dialog");
  document.getElementById("delete-name").textContent = name;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

/** A timestamp for people: a <time> element showing the local date and time (the browser's
 *  toLocaleString) with the UTC value (RFC 3339, `Z`) in its title; given a `text` (e.g. an age), it
 *  shows that and the title holds the local time too. "-" for none; a non-time is shown as it is. */
function formatTime(iso, text) {
  if (!iso) return document.createTextNode("-");
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) return document.createTextNode(String(iso));
  const utc = when.toISOString().replace(/\.000Z$/, "Z");
  const node = document.createElement("time");
  node.dateTime = utc;
  node.title = text === undefined ? utc : `${when.toLocaleString()} (${utc})`;
  node.textContent = text ?? when.toLocaleString();
  return node;
}
