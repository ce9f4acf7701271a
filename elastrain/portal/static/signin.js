"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("signin-form");
  const input = document.getElementById("token");
  input.focus();
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const value = input.value.trim();
    if (!value) { Portal.fieldError("token", "Enter your API token."); return; }
    try {
      await Portal.api("GET", "/me", undefined, { token: value });
    } catch (err) {
      Portal.fieldError("token", err.status === 401
        ? "That token was not accepted: " + err.message
        : "Sign-in failed: " + err.message);
      return;
    }
    Portal.setToken(value);
    const next = new URLSearchParams(location.search).get("next");
    location.assign(next ? Portal.safeNext(next) : "/clusters");
  });
});
