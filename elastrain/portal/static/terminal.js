"use strict";
/* xterm.js bridged to WS /api/v1/clusters/NAME/terminal; the token goes in the first message. */
document.addEventListener("DOMContentLoaded", () => {
  const name = document.body.dataset.cluster;
  const status = document.getElementById("term-status");
  // lineHeight > 1: at 1.0 the DOM renderer clips underscores at the bottom of the cell
  const term = new Terminal({ cursorBlink: true, fontSize: 14, lineHeight: 1.15, convertEol: false, scrollback: 5000 });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(document.getElementById("terminal"));
  fit.fit();
  if (!Portal.token()) return;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}/api/v1/clusters/${encodeURIComponent(name)}/terminal`);
  ws.addEventListener("open", () => {
    ws.send(JSON.stringify({ token: Portal.token(), resize: [term.cols, term.rows] }));
    status.textContent = "Connected to the launcher container.";
    term.focus();
  });
  ws.addEventListener("message", (ev) => term.write(ev.data));
  ws.addEventListener("close", (ev) => {
    status.textContent = "Disconnected" + (ev.reason ? ": " + ev.reason : ".") + " Reload to reconnect.";
  });
  term.onData((data) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ input: data })); });
  term.onResize(({ cols, rows }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: [cols, rows] }));
  });
  window.addEventListener("resize", () => fit.fit());
});
